// `moelab data prepare`: tokenizer + token shards from the exported corpus.
#include <cstdio>

#include <fmt/format.h>

#include "cli/commands.h"
#include "core/data/prepare.h"

namespace moelab::cli {

void AddDataCommand(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("data", "Prepare training data");
  cmd->require_subcommand(1);
  auto opt = std::make_shared<PrepareOptions>();
  CLI::App* prep = cmd->add_subcommand(
      "prepare", "Train a SentencePiece BPE tokenizer and write memory-mapped token shards");
  prep->add_option("--input", opt->inputs, "Text files or folders of *.txt")
      ->capture_default_str();
  prep->add_option("--out", opt->out_dir, "Output folder")->capture_default_str();
  prep->add_option("--vocab", opt->vocab_size, "Tokenizer vocabulary size")
      ->capture_default_str();
  prep->add_option("--val-fraction", opt->val_fraction, "Share of documents held out")
      ->capture_default_str();
  prep->add_option("--seed", opt->seed, "Seed of the split and the tokenizer sample")
      ->capture_default_str();
  prep->add_option("--max-sentences", opt->max_sentences,
                   "Documents sampled to train the tokenizer")
      ->capture_default_str();
  prep->add_option("--threads", opt->threads, "Threads")->capture_default_str();
  prep->add_flag("--force", opt->force, "Rebuild even if the folder is already prepared");
  prep->callback([opt]() {
    const PrepareResult r = PrepareCorpus(*opt);
    if (r.skipped) {
      fmt::print(stderr, "moelab data prepare: {} is already prepared with these options\n",
                 r.out_dir);
    } else {
      fmt::print(stderr, "moelab data prepare: wrote {} in {:.1f} s\n", r.out_dir, r.seconds);
    }
    fmt::print(stderr, "  vocab {}, {} train tokens, {} validation tokens\n",
               r.meta.value("vocab_size", 0), r.meta.value("train_tokens", int64_t{0}),
               r.meta.value("val_tokens", int64_t{0}));
  });
}

}  // namespace moelab::cli
