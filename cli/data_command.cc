// `moelab data prepare|import`: tokenizer + token shards from text or JSON Lines, or adopted
// nanoGPT / llm.c token shards (docs/data.md).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "cli/commands.h"
#include "core/data/import.h"
#include "core/data/prepare.h"

namespace moelab::cli {

namespace {

void AddPrepare(CLI::App* cmd) {
  auto opt = std::make_shared<PrepareOptions>();
  CLI::App* prep = cmd->add_subcommand(
      "prepare",
      "Train a SentencePiece BPE tokenizer (or reuse one) and write memory-mapped token shards "
      "from text or JSON Lines (.gz/.zst streamed)");
  prep->add_option("--input", opt->inputs,
                   "Files or folders: *.txt (a document per line), *.jsonl / *.ndjson (a "
                   "document per line in --text-field), each optionally .gz or .zst")
      ->capture_default_str();
  prep->add_option("--text-field", opt->text_field, "JSON Lines: the field holding the text")
      ->capture_default_str();
  prep->add_option("--tokenizer", opt->tokenizer_model,
                   "Encode with this SentencePiece model instead of training one (--vocab, "
                   "--max-sentences are then unused)")
      ->check(CLI::ExistingFile);
  prep->add_option("--out", opt->out_dir, "Output folder")->capture_default_str();
  prep->add_option("--vocab", opt->vocab_size, "Tokenizer vocabulary size")->capture_default_str();
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
      fmt::print(stderr,
                 "moelab data prepare: wrote {} in {:.1f} s (encoded {:.1f} MB at {:.1f} MB/s)\n",
                 r.out_dir, r.seconds, r.encode_bytes / 1e6,
                 r.encode_bytes / 1e6 / std::max(1e-9, r.encode_seconds));
    }
    fmt::print(stderr, "  vocab {}, {} train tokens, {} validation tokens\n",
               r.meta.value("vocab_size", 0), r.meta.value("train_tokens", int64_t{0}),
               r.meta.value("val_tokens", int64_t{0}));
  });
}

void AddImport(CLI::App* cmd) {
  auto opt = std::make_shared<ImportOptions>();
  CLI::App* imp = cmd->add_subcommand(
      "import",
      "Adopt nanoGPT / llm.c token shards (.bin, 256-int32 header, magic 20240520, uint16 "
      "tokens) as they are: memory-mapped, not copied");
  imp->add_option("--input", opt->inputs, "Shard files or folders of *.bin")->required();
  imp->add_option("--out", opt->out_dir, "Folder for meta.json (data.path)")->capture_default_str();
  imp->add_option("--vocab", opt->vocab_size,
                  "Vocabulary of the tokens (default: from the header version: 1 = GPT-2, 50257)");
  imp->add_option("--eos", opt->eos_id,
                  "Document separator token (default: 50256 with the GPT-2 vocabulary)");
  imp->add_option("--val", opt->val_inputs,
                  "Validation shards (default: inputs named *_val*, else a held-out tail)");
  imp->add_option("--val-fraction", opt->val_fraction,
                  "Share of the training tokens held out when there is no validation shard")
      ->capture_default_str();
  imp->add_option("--threads", opt->threads, "Threads")->capture_default_str();
  imp->callback([opt]() {
    const ImportResult r = ImportShards(*opt);
    fmt::print(stderr, "moelab data import: wrote {}/meta.json in {:.1f} s\n", r.out_dir,
               r.seconds);
    fmt::print(stderr, "  vocab {}, {} train tokens in {} shard(s), {} validation tokens\n",
               r.meta.value("vocab_size", 0), r.meta.value("train_tokens", int64_t{0}),
               r.meta["shards"].size(), r.meta.value("val_tokens", int64_t{0}));
    fmt::print(stderr, "  train on it: \"data\": {{\"source\": \"corpus\", \"path\": \"{}\"}}\n",
               r.out_dir);
  });
}

}  // namespace

void AddDataCommand(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("data", "Prepare or import training data");
  cmd->require_subcommand(1);
  AddPrepare(cmd);
  AddImport(cmd);
}

}  // namespace moelab::cli
