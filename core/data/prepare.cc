#include "core/data/prepare.h"

#include <fmt/format.h>
#include <omp.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include "core/data/documents.h"
#include "core/data/random.h"
#include "core/data/shards.h"
#include "core/utc_time.h"

namespace moelab {
namespace fs = std::filesystem;

namespace {

constexpr int kFormatVersion = 1;
constexpr int kUnkId = 0;
constexpr int kEosId = 1;
constexpr const char* kTmpDirName = ".prepare-tmp";
constexpr uint64_t kSampleSalt = 0x746f6b656e697a65ULL;  // tokenizer sample vs. val split

// Stable across platforms and runs (std::hash is not).
uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

double DocUnit(uint64_t seed, uint64_t salt, std::string_view doc) {
  return data::ToUnit(data::HashCombine(seed ^ salt, Fnv1a(doc)));
}

std::string HumanCount(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}G", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.1f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

std::string Clock(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  return s >= 3600 ? fmt::format("{}:{:02d}:{:02d}", s / 3600, s / 60 % 60, s % 60)
                   : fmt::format("{}:{:02d}", s / 60, s % 60);
}

// Reports progress through the callback or as one rewritten stderr line, at most ~5 times/s.
// Stages that read the inputs pass the bytes they have read (`total_bytes` in all), which gives
// the rate and, from the fraction done, the time left.
class Progress {
 public:
  Progress(const PrepareOptions& o, int64_t total_bytes) : opt_(o), total_bytes_(total_bytes) {}
  void Update(const std::string& stage, double fraction, const std::string& detail = "",
              bool force = false) {
    auto now = std::chrono::steady_clock::now();
    if (stage != stage_) stage_start_ = now;
    if (!force && stage == stage_ && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    PrepareProgress p{stage, fraction, detail};
    const double elapsed = std::chrono::duration<double>(now - stage_start_).count();
    if (elapsed > 0.5 && fraction > 0.0 && stage != "train tokenizer") {
      p.mb_per_s = fraction * double(total_bytes_) / 1e6 / elapsed;
      p.eta_s = elapsed * (1.0 - fraction) / fraction;
    }
    if (opt_.progress) {
      opt_.progress(p);
    } else if (!opt_.quiet) {
      if (!stage_.empty() && stage != stage_) std::fputc('\n', stderr);
      std::string rate;
      if (p.eta_s >= 0) rate = fmt::format("{:.1f} MB/s, ETA {}", p.mb_per_s, Clock(p.eta_s));
      std::fprintf(stderr, "\rprepare: %-16s %5.1f%%  %-16s %-24s", stage.c_str(), 100.0 * fraction,
                   detail.c_str(), rate.c_str());
      std::fflush(stderr);
    }
    stage_ = stage;
  }
  void Done() {
    if (!opt_.progress && !opt_.quiet && !stage_.empty()) std::fputc('\n', stderr);
    stage_.clear();
  }
  void Message(const std::string& msg) {
    if (opt_.progress || opt_.quiet) return;
    Done();
    std::fprintf(stderr, "prepare: %s\n", msg.c_str());
  }

 private:
  const PrepareOptions& opt_;
  int64_t total_bytes_;
  std::string stage_;
  std::chrono::steady_clock::time_point last_{}, stage_start_{};
};

// Feeds the sampled documents to the SentencePiece trainer without another copy.
class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& v) : v_(v) {}
  bool done() const override { return i_ >= v_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return v_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& v_;
  size_t i_ = 0;
};

// Appends uint16 tokens to prefix_000.bin, prefix_001.bin, ... with at most `cap` per file.
class ShardWriter {
 public:
  ShardWriter(fs::path dir, std::string prefix, int64_t cap)
      : dir_(std::move(dir)), prefix_(std::move(prefix)), cap_(cap) {}
  ~ShardWriter() {
    if (f_ != nullptr) std::fclose(f_);
  }
  void Append(const std::vector<int>& ids) {
    for (int id : ids) Push(id);
  }
  void Push(int id) {
    if (f_ == nullptr || in_file_ == cap_) Open();
    buf_.push_back(static_cast<uint8_t>(id & 0xff));  // little-endian on every host
    buf_.push_back(static_cast<uint8_t>(id >> 8));
    ++in_file_;
    ++total_;
    if (buf_.size() >= (1 << 20)) Flush();
  }
  void Close() {
    if (f_ == nullptr) Open();  // an empty split still gets one (empty) shard
    Flush();
    if (std::fclose(f_) != 0) throw std::runtime_error("closing shard failed (disk full?)");
    f_ = nullptr;
  }
  const std::vector<std::string>& names() const { return names_; }
  int64_t total() const { return total_; }

 private:
  void Open() {
    if (f_ != nullptr) {
      Flush();
      if (std::fclose(f_) != 0) throw std::runtime_error("closing shard failed (disk full?)");
    }
    std::string name = fmt::format("{}_{:03d}.bin", prefix_, names_.size());
    f_ = std::fopen((dir_ / name).c_str(), "wb");
    if (f_ == nullptr) throw std::runtime_error((dir_ / name).string() + ": cannot create");
    names_.push_back(name);
    in_file_ = 0;
  }
  void Flush() {
    if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size()) {
      throw std::runtime_error(fmt::format("writing {} failed (disk full?)", names_.back()));
    }
    buf_.clear();
  }
  fs::path dir_;
  std::string prefix_;
  int64_t cap_;
  std::FILE* f_ = nullptr;
  std::vector<uint8_t> buf_;
  std::vector<std::string> names_;
  int64_t in_file_ = 0, total_ = 0;
};

struct Source {
  std::string path;  // absolute
  int64_t bytes = 0;
  std::string hash;  // FNV-1a 64 of the content: an edit that keeps the size still rebuilds
  int64_t docs = 0;
};

// ~1 GB/s, so hashing the default corpus costs well under a second and makes the up-to-date
// check independent of timestamps (copies, re-exports).
std::string HashFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open for reading");
  uint64_t h = 0xcbf29ce484222325ULL;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize got = in.gcount();
    for (std::streamsize i = 0; i < got; ++i) {
      h = (h ^ static_cast<unsigned char>(buf[i])) * 0x100000001b3ULL;
    }
  }
  return fmt::format("{:016x}", h);
}

// The options that determine the output; a folder is reused only when these match exactly.
// A given tokenizer replaces the options that train one; the text field matters only to JSON
// Lines inputs but is recorded always (the file names are part of the identity anyway).
nlohmann::json Signature(const PrepareOptions& o, const std::vector<Source>& sources,
                         const std::string& tokenizer_hash) {
  nlohmann::json src = nlohmann::json::array();
  for (const Source& s : sources) {
    src.push_back({{"path", s.path}, {"bytes", s.bytes}, {"fnv1a64", s.hash}});
  }
  nlohmann::json sig = {{"format_version", kFormatVersion},
                        {"val_fraction", o.val_fraction},
                        {"seed", o.seed},
                        {"shard_tokens", o.shard_tokens},
                        {"sources", src}};
  if (o.tokenizer_model.empty()) {
    sig["vocab_size"] = o.vocab_size;
    sig["max_sentences"] = o.max_sentences;
    sig["character_coverage"] = o.character_coverage;
  } else {
    sig["tokenizer_model"] = {{"path", fs::weakly_canonical(fs::absolute(o.tokenizer_model))},
                              {"fnv1a64", tokenizer_hash}};
  }
  if (o.text_field != "text") sig["text_field"] = o.text_field;
  return sig;
}

// True when out_dir holds a complete corpus made with `signature` (shard sizes included).
bool IsUpToDate(const fs::path& out, const nlohmann::json& signature) {
  std::ifstream in(out / "meta.json");
  if (!in) return false;
  try {
    nlohmann::json meta = nlohmann::json::parse(in);
    if (meta.value("options", nlohmann::json()) != signature) return false;
    if (!fs::exists(out / meta.at("tokenizer").get<std::string>())) return false;
    for (const char* split : {"shards", "val_shards"}) {
      int64_t bytes = 0;
      for (const auto& name : meta.at(split)) {
        fs::path p = out / name.get<std::string>();
        if (!fs::exists(p)) return false;
        bytes += static_cast<int64_t>(fs::file_size(p));
      }
      const char* key = std::string_view(split) == "shards" ? "train_tokens" : "val_tokens";
      if (bytes != 2 * meta.at(key).get<int64_t>()) return false;
    }
    return true;
  } catch (const std::exception&) {
    return false;  // unreadable or foreign meta.json: rebuild
  }
}

void Validate(const PrepareOptions& o) {
  if (o.tokenizer_model.empty() && (o.vocab_size < 260 || o.vocab_size > 65536)) {
    throw std::runtime_error(fmt::format(
        "vocab_size {} must be between 260 and 65536: byte fallback needs 256 byte pieces plus "
        "<unk> and </s>, and shards store tokens as uint16",
        o.vocab_size));
  }
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0)) {
    throw std::runtime_error(fmt::format("val_fraction {} must be in [0, 1)", o.val_fraction));
  }
  if (o.max_sentences < 1) throw std::runtime_error("max_sentences must be >= 1");
  if (!(o.character_coverage > 0.0 && o.character_coverage <= 1.0)) {
    throw std::runtime_error(
        fmt::format("character_coverage {} must be in (0, 1]", o.character_coverage));
  }
  if (o.shard_tokens < 1) throw std::runtime_error("shard_tokens must be >= 1");
  if (o.out_dir.empty()) throw std::runtime_error("out_dir is empty");
  if (o.text_field.empty()) throw std::runtime_error("text_field is empty");
}

// Loads and checks a tokenizer: shards hold uint16 ids and need a separator between documents.
void LoadTokenizer(const std::string& proto, const std::string& what,
                   sentencepiece::SentencePieceProcessor* sp) {
  if (auto st = sp->LoadFromSerializedProto(proto); !st.ok()) {
    throw std::runtime_error(fmt::format("{}: not a SentencePiece model: {}", what, st.ToString()));
  }
  if (sp->GetPieceSize() > 65536) {
    throw std::runtime_error(
        fmt::format("{}: {} pieces do not fit the uint16 token shards (at most 65536)", what,
                    sp->GetPieceSize()));
  }
  if (sp->eos_id() < 0) {
    throw std::runtime_error(fmt::format(
        "{}: the model has no end-of-sentence piece (eos_id -1), which the shards need to "
        "separate documents",
        what));
  }
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open for reading");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string TrainTokenizer(const PrepareOptions& o, const std::vector<std::string>& sample) {
  std::unordered_map<std::string, std::string> args = {
      {"model_prefix", ""},  // the model comes back as a serialized proto
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"byte_fallback", "true"},
      {"character_coverage", fmt::format("{}", o.character_coverage)},
      // Identity normalisation keeps decode(encode(x)) == x, so token counts and losses refer
      // to the text as exported.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"split_digits", "true"},
      {"unk_id", std::to_string(kUnkId)},
      {"eos_id", std::to_string(kEosId)},
      {"bos_id", "-1"},
      {"pad_id", "-1"},
      // The sample is drawn here, deterministically; SentencePiece's own shuffle is not seeded.
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"max_sentence_length", "16384"},
      {"num_threads", std::to_string(std::max(1, o.threads))},
      {"minloglevel", "2"},
  };
  VectorIterator it(sample);
  std::string proto;
  auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &proto);
  if (!status.ok()) {
    std::string hint;
    if (status.ToString().find("required_chars") != std::string::npos) {
      hint = fmt::format(
          " (the vocabulary holds 256 byte pieces, <unk>, </s> and every character kept by "
          "character_coverage {}: raise vocab_size or lower character_coverage, which spells "
          "rarer characters with byte pieces)",
          o.character_coverage);
    }
    throw std::runtime_error(
        fmt::format("tokenizer training failed (vocab_size {}, {} sample documents): {}{}",
                    o.vocab_size, sample.size(), status.ToString(), hint));
  }
  return proto;
}

void WriteFile(const fs::path& p, const std::string& content) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(content.data(), static_cast<std::streamsize>(content.size()));
  f.close();
  if (!f) throw std::runtime_error(p.string() + ": write failed (disk full?)");
}

// The inputs, each with its size and content hash (the signature's sources); total_bytes their sum.
std::vector<Source> ReadSources(const PrepareOptions& o, int64_t* total_bytes) {
  std::vector<Source> sources;
  for (const std::string& f : ListInputFiles(o.inputs)) {
    Source s;
    s.path = fs::weakly_canonical(fs::absolute(f)).string();
    s.bytes = static_cast<int64_t>(fs::file_size(f));
    s.hash = HashFile(f);
    *total_bytes += s.bytes;
    sources.push_back(s);
  }
  return sources;
}

// What meta.json records of the encoded corpus.
struct MetaCounts {
  int vocab = 0, eos = 0, unk = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  int64_t train_documents = 0, val_documents = 0, sample_documents = 0;
};

nlohmann::json MetaJson(const PrepareOptions& o, const std::vector<Source>& sources,
                        const nlohmann::json& signature, bool given_tokenizer, const MetaCounts& c,
                        const std::vector<std::string>& train_shards,
                        const std::vector<std::string>& val_shards) {
  nlohmann::json src = nlohmann::json::array();
  for (const Source& s : sources) {
    src.push_back(
        {{"path", s.path}, {"bytes", s.bytes}, {"fnv1a64", s.hash}, {"documents", s.docs}});
  }
  nlohmann::json meta = {
      {"format_version", kFormatVersion},
      {"vocab_size", c.vocab},
      {"tokenizer", "tokenizer.model"},
      {"tokenizer_type", !given_tokenizer ? "sentencepiece-bpe" : "sentencepiece (given)"},
      {"eos_id", c.eos},
      {"unk_id", c.unk},
      {"dtype", "uint16"},
      {"train_tokens", c.train_tokens},
      {"val_tokens", c.val_tokens},
      {"train_documents", c.train_documents},
      {"val_documents", c.val_documents},
      {"shards", train_shards},
      {"val_shards", val_shards},
      {"sources", src},
      {"seed", o.seed},
      {"val_fraction", o.val_fraction},
      {"tokenizer_sample_documents", c.sample_documents},
      {"created_at", UtcNowIso8601()},
      {"entropy_rate", nullptr},
      {"options", signature},
  };
  if (given_tokenizer) {
    meta["tokenizer_source"] = signature["tokenizer_model"];
  }
  return meta;
}

// Swaps the new files in: removes stale shards of an earlier layout, renames the new ones, and
// makes meta.json visible last.
void SwapIn(const fs::path& out, const fs::path& tmp, const std::vector<std::string>& train_shards,
            const std::vector<std::string>& val_shards) {
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.ends_with(".bin") &&
        (name.starts_with("train_") || name.starts_with("val_"))) {
      fs::remove(e.path());
    }
  }
  for (const auto& name : train_shards) fs::rename(tmp / name, out / name);
  for (const auto& name : val_shards) fs::rename(tmp / name, out / name);
  fs::rename(tmp / "tokenizer.model", out / "tokenizer.model");
  fs::rename(tmp / "meta.json", out / "meta.json");
  fs::remove_all(tmp);
}

}  // namespace

std::vector<std::string> ListInputFiles(const std::vector<std::string>& inputs) {
  if (inputs.empty()) {
    throw std::runtime_error(
        "no inputs: give text or JSON Lines files or a folder of them (e.g. the one written by "
        "scripts/export-corpus.sh)");
  }
  // The hint names the script that exports the default corpus to such a folder.
  return ExpandInputFiles(
      inputs, [](const fs::path& p) { return IsDocumentFile(p.filename()); },
      [](const std::string& in) {
        return in +
               ": folder has no *.txt or *.jsonl files (.gz and .zst included; run "
               "scripts/export-corpus.sh " +
               in + " to export the default corpus)";
      },
      [](const std::string& in) {
        return in + ": no such file or folder (run scripts/export-corpus.sh " + in +
               " to export the default corpus)";
      });
}

PrepareResult PrepareCorpus(const PrepareOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  Validate(o);
  PrepareResult result;
  const fs::path out(o.out_dir);
  result.out_dir = out.string();

  int64_t total_bytes = 0;
  std::vector<Source> sources = ReadSources(o, &total_bytes);
  Progress progress(o, total_bytes);
  std::string given_proto, given_hash;
  if (!o.tokenizer_model.empty()) {
    given_proto = ReadFileBytes(o.tokenizer_model);
    given_hash = fmt::format("{:016x}", Fnv1a(given_proto));
  }
  const nlohmann::json signature = Signature(o, sources, given_hash);
  if (!o.force && IsUpToDate(out, signature)) {
    std::ifstream in(out / "meta.json");
    result.meta = nlohmann::json::parse(in);
    result.skipped = true;
    progress.Message(fmt::format("{} is up to date ({} train / {} val tokens); nothing to do",
                                 out.string(), HumanCount(result.meta["train_tokens"]),
                                 HumanCount(result.meta["val_tokens"])));
    return result;
  }
  // Checked before anything is written, so a wrong --tokenizer leaves the folder as it was.
  sentencepiece::SentencePieceProcessor sp;
  if (!given_proto.empty()) LoadTokenizer(given_proto, o.tokenizer_model, &sp);

  // From here on the folder is invalid until the new meta.json lands.
  fs::create_directories(out);
  fs::remove(out / "meta.json");
  const fs::path tmp = out / kTmpDirName;
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  struct RemoveOnExit {  // a failed run leaves no partial files behind
    fs::path p;
    ~RemoveOnExit() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{tmp};

  // Streams every document of every source in order, with progress of `stage` by input bytes.
  auto for_each_doc = [&](const std::string& stage, const std::function<std::string()>& detail,
                          const std::function<void(Source&, const std::string&)>& fn) {
    int64_t before = 0;
    for (Source& s : sources) {
      ForEachDocument(
          s.path, o.text_field, [&](const std::string& d) { fn(s, d); },
          [&](int64_t consumed) {
            progress.Update(stage, double(before + consumed) / std::max<int64_t>(1, total_bytes),
                            detail());
          });
      before += s.bytes;
    }
    progress.Update(stage, 1.0, detail(), true);
  };

  // Pass 1: count documents and fix the validation cut-off. A tiny corpus whose hashes all miss
  // val_fraction still gets its lowest-hash document as validation, so ValBatch always works.
  int64_t docs = 0, val_docs = 0;
  double min_unit = 2.0;
  for_each_doc(
      "scan", [&] { return HumanCount(double(docs)) + " documents"; },
      [&](Source& s, const std::string& d) {
        double u = DocUnit(o.seed, 0, d);
        min_unit = std::min(min_unit, u);
        val_docs += u < o.val_fraction;
        ++s.docs;
        ++docs;
      });
  if (docs < 2) throw std::runtime_error("the inputs hold fewer than 2 documents");
  const bool force_one_val = o.val_fraction > 0.0 && val_docs == 0;
  auto is_val = [&](const std::string& d) {
    double u = DocUnit(o.seed, 0, d);
    return force_one_val ? u <= min_unit : u < o.val_fraction;
  };

  if (!force_one_val && val_docs >= docs) {
    throw std::runtime_error(
        fmt::format("val_fraction {} left no training documents", o.val_fraction));
  }

  // Pass 2 (only when training a tokenizer): its sample, from training documents only. At most
  // about max_sentences documents are held, whatever the corpus size.
  int64_t sample_docs = 0;
  std::string proto = given_proto;
  if (proto.empty()) {
    const double keep = std::min(1.0, double(o.max_sentences) / double(docs - val_docs));
    std::vector<std::string> sample;
    for_each_doc(
        "sample", [&] { return HumanCount(double(sample.size())) + " documents"; },
        [&](Source&, const std::string& d) {
          if (!is_val(d) && DocUnit(o.seed, kSampleSalt, d) < keep) sample.push_back(d);
        });
    progress.Update("train tokenizer", 0.0, fmt::format("vocab {}", o.vocab_size), true);
    proto = TrainTokenizer(o, sample);
    sample_docs = static_cast<int64_t>(sample.size());
    sample = {};
    progress.Update("train tokenizer", 1.0, fmt::format("vocab {}", o.vocab_size), true);
    LoadTokenizer(proto, "the trained tokenizer", &sp);
    if (sp.GetPieceSize() != o.vocab_size || sp.eos_id() != kEosId) {
      throw std::runtime_error(fmt::format("trained tokenizer has {} pieces (eos {}), expected {}",
                                           sp.GetPieceSize(), sp.eos_id(), o.vocab_size));
    }
  }
  WriteFile(tmp / "tokenizer.model", proto);
  const int vocab = sp.GetPieceSize(), eos = sp.eos_id();

  // Pass 3: encode in blocks of documents; blocks are encoded in parallel and written in input
  // order, so the shards do not depend on the thread count. A block is bounded in documents and
  // bytes, so memory stays flat however large the corpus.
  const auto encode_t0 = std::chrono::steady_clock::now();
  ShardWriter train(tmp, "train", o.shard_tokens), val(tmp, "val", o.shard_tokens);
  constexpr size_t kBlock = 32768;
  constexpr int64_t kBlockBytes = 64 << 20;
  std::vector<std::string> block;
  std::vector<std::vector<int>> ids;
  std::vector<char> block_is_val;
  int64_t train_docs = 0, encoded_bytes = 0, block_bytes = 0;
  val_docs = 0;
  auto flush = [&]() {
    const int64_t n = static_cast<int64_t>(block.size());
    ids.resize(n);
    std::string error;
#pragma omp parallel for schedule(dynamic, 64) num_threads(std::max(1, o.threads))
    for (int64_t i = 0; i < n; ++i) {
      auto st = sp.Encode(block[i], &ids[i]);
      if (!st.ok()) {
#pragma omp critical
        error = st.ToString();
      }
    }
    if (!error.empty()) throw std::runtime_error("encoding failed: " + error);
    for (int64_t i = 0; i < n; ++i) {
      ShardWriter& w = block_is_val[i] ? val : train;
      w.Append(ids[i]);
      w.Push(eos);
      (block_is_val[i] ? val_docs : train_docs) += 1;
    }
    block.clear();
    block_is_val.clear();
    encoded_bytes += block_bytes;
    block_bytes = 0;
  };
  for_each_doc(
      "encode", [&] { return HumanCount(double(train.total() + val.total())) + " tokens"; },
      [&](Source&, const std::string& d) {
        block_is_val.push_back(is_val(d));
        block.push_back(d);
        block_bytes += static_cast<int64_t>(d.size()) + 1;
        if (block.size() == kBlock || block_bytes >= kBlockBytes) flush();
      });
  flush();
  train.Close();
  val.Close();
  result.encode_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - encode_t0).count();
  result.encode_bytes = encoded_bytes;
  progress.Update("encode", 1.0, HumanCount(double(train.total() + val.total())) + " tokens", true);
  progress.Done();

  MetaCounts counts;
  counts.vocab = vocab;
  counts.eos = eos;
  counts.unk = sp.unk_id();
  counts.train_tokens = train.total();
  counts.val_tokens = val.total();
  counts.train_documents = train_docs;
  counts.val_documents = val_docs;
  counts.sample_documents = sample_docs;
  nlohmann::json meta =
      MetaJson(o, sources, signature, !given_proto.empty(), counts, train.names(), val.names());
  WriteFile(tmp / "meta.json", meta.dump(2) + "\n");

  SwapIn(out, tmp, train.names(), val.names());

  result.meta = std::move(meta);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  progress.Message(fmt::format(
      "wrote {}: {} train + {} val tokens, {} train shard(s), {:.1f} s (encoding {:.1f} MB/s)",
      out.string(), HumanCount(double(train.total())), HumanCount(double(val.total())),
      train.names().size(), result.seconds,
      result.encode_bytes / 1e6 / std::max(1e-9, result.encode_seconds)));
  return result;
}

}  // namespace moelab
