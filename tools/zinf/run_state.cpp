// zinf train: the run's seed, data identity and batch geometry in a checkpoint, and the checks
// that make --resume continue the saved run rather than silently start another data order.
#include "run_state.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/json_check.h"
#include "zero3/checkpoint_format.h"
#include "zinf/log.h"
#include "zinf/zero3/checkpoint.h"

namespace zinf::cli {
namespace {

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::sys_error("open " + path, errno);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::sys_error("read " + path, errno);
  return text.str();
}

std::string geometry_text(const BatchGeometry& b) {
  return fmt::format("micro-batch {} x accumulation {} x {} rank{}", b.micro_batch, b.grad_accum, b.world_size,
                     b.world_size == 1 ? "" : "s");
}

}  // namespace

std::string DataIdentity::describe() const {
  return fmt::format("{} ({} tokens, vocab {}, content hash {:016x})",
                     path.empty() ? "the built-in corpus, " + source : path, tokens, vocab, hash);
}

std::uint64_t content_hash(std::span<const std::uint32_t> tokens) {
  // FNV-1a's constants over 64-bit words, each step followed by a xor-shift so that high bits
  // reach low ones; every step is a bijection of h, so any one changed word changes the result.
  // The length goes in last. Ids below 65536 are packed four to a word as 16-bit values, which
  // keeps the hash of such data what it was when zinf held tokens as uint16 (checkpoints from
  // then still recognise their data); data with a larger id packs two 32-bit ids to a word and
  // mixes a marker first, so it never matches a 16-bit packing.
  constexpr std::uint64_t kPrime = 0x100000001b3ULL;
  std::uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&](std::uint64_t word) {
    h = (h ^ word) * kPrime;
    h ^= h >> 32;
  };
  const bool wide = std::any_of(tokens.begin(), tokens.end(), [](std::uint32_t t) { return t > 0xffff; });
  const std::size_t per_word = wide ? 2 : 4, bits = wide ? 32 : 16;
  if (wide) mix(0x3233746e69753a77ULL);  // "w:uint32"
  std::size_t i = 0;
  for (; i + per_word <= tokens.size(); i += per_word) {
    std::uint64_t word = 0;
    for (std::size_t k = 0; k < per_word; ++k) word |= static_cast<std::uint64_t>(tokens[i + k]) << (bits * k);
    mix(word);
  }
  std::uint64_t tail = 0;
  for (std::size_t k = 0; i + k < tokens.size(); ++k) tail |= static_cast<std::uint64_t>(tokens[i + k]) << (bits * k);
  mix(tail);
  mix(tokens.size());
  return h;
}

DataIdentity identify_data(const model::TokenDataset& data, const std::string& path, model::DataFormat format) {
  DataIdentity id;
  if (!path.empty()) {
    std::error_code ec;
    const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
    id.path = ec ? path : absolute.lexically_normal().string();
  }
  id.source = data.source();
  id.tokens = data.size();
  id.vocab = data.vocab_size();
  id.hash = content_hash(data.tokens());
  id.format = model::data_format_name(format);
  return id;
}

std::string run_state_json(const RunState& s) {
  // epoch, row, seed, rows_per_step and world_size are read by older zinf too.
  const nlohmann::json j = {{"epoch", s.position.epoch},
                            {"row", s.position.row},
                            {"seed", s.seed},
                            {"rows_per_step", s.batch.rows_per_step()},
                            {"world_size", s.batch.world_size},
                            {"micro_batch", s.batch.micro_batch},
                            {"seq", s.batch.seq},
                            {"grad_accum", s.batch.grad_accum},
                            {"data",
                             {{"path", s.data.path},
                              {"source", s.data.source},
                              {"tokens", s.data.tokens},
                              {"vocab", s.data.vocab},
                              {"format", s.data.format},
                              {"hash", fmt::format("{:016x}", s.data.hash)}}}};
  nlohmann::json out = j;
  if (!s.source_dtype.empty()) out["source_dtype"] = s.source_dtype;
  return out.dump();
}

std::string source_dtype_of(const std::string& client_state) {
  const auto j = nlohmann::json::parse(client_state, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return "";
  const auto it = j.find("source_dtype");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

Result<SavedRun> SavedRun::read(const std::string& dir) {
  SavedRun r;
  r.dir_ = dir;
  auto latest = zero3::read_latest_tag(dir);
  if (!latest.is_ok()) return latest.status().with_context("--resume");
  r.tag_ = std::move(latest).value();
  ZINF_ASSIGN_OR_RETURN(r.folder_, zero3::checkpoint_tag_folder(dir, r.tag_));
  ZINF_ASSIGN_OR_RETURN(std::string text, read_text(r.folder_ + "/engine.json"));
  const std::string where = r.folder_ + "/engine.json";
  auto parsed = jsonck::parse<nlohmann::json>(text, where);
  if (!parsed.is_ok()) return parsed.status().with_context(fmt::format("--resume {}", dir));
  const nlohmann::json& engine = parsed.value();
  const nlohmann::json* client_state = jsonck::member(engine, "client_state");
  if (client_state == nullptr || !client_state->is_string()) {
    return Status::corruption(fmt::format("--resume {}: {} has no client_state", dir, where));
  }
  if (const nlohmann::json* model = jsonck::member(engine, "model"); model != nullptr && model->is_object()) {
    nlohmann::json m = *model;
    if (!m.contains("type")) m["type"] = "gpt";  // checkpoints from before the Model interface
    r.model_json_ = m.dump();
  }
  const std::string state_where = where + " client_state";
  auto state = jsonck::parse<nlohmann::json>(client_state->get<std::string>(), state_where);
  const nlohmann::json* j = state.is_ok() ? &state.value() : nullptr;
  if (j == nullptr || !j->is_object() || !j->contains("epoch") || !j->contains("row")) {
    return Status::corruption(fmt::format("--resume {}: checkpoint has no data loader position", dir));
  }
  // Every value checked for type and range (no exceptions, no truncation to int).
  const Status read = [&]() -> Status {
    const jsonck::Where w{state_where, ""};
    constexpr std::uint64_t kU64 = std::numeric_limits<std::uint64_t>::max();
    constexpr std::int64_t kInt = std::numeric_limits<int>::max();
    ZINF_ASSIGN_OR_RETURN(const std::uint64_t epoch, jsonck::uint_key(*j, "epoch", 0, kU64, w));
    ZINF_ASSIGN_OR_RETURN(const std::uint64_t row, jsonck::uint_key(*j, "row", 0, kU64, w));
    r.position_ = {epoch, row};
    if (j->contains("seed")) {
      ZINF_ASSIGN_OR_RETURN(r.seed_, jsonck::uint_key(*j, "seed", 0, kU64, w));
    }
    if (j->contains("rows_per_step")) {
      ZINF_ASSIGN_OR_RETURN(r.rows_per_step_, jsonck::uint_key(*j, "rows_per_step", 0, kU64, w));
    }
    ZINF_ASSIGN_OR_RETURN(const std::int64_t world, jsonck::int_key_or(*j, "world_size", 1, 1, kInt, w));
    r.world_size_ = static_cast<int>(world);
    if (j->contains("micro_batch") && j->contains("seq") && j->contains("grad_accum")) {
      ZINF_ASSIGN_OR_RETURN(const std::int64_t micro, jsonck::int_key(*j, "micro_batch", 1, kInt, w));
      ZINF_ASSIGN_OR_RETURN(const std::int64_t seq, jsonck::int_key(*j, "seq", 1, kInt, w));
      ZINF_ASSIGN_OR_RETURN(const std::int64_t accum, jsonck::int_key(*j, "grad_accum", 1, kInt, w));
      r.batch_ = BatchGeometry{static_cast<int>(micro), static_cast<int>(seq), static_cast<int>(accum), r.world_size_};
    }
    ZINF_ASSIGN_OR_RETURN(r.source_dtype_, jsonck::string_key_or(*j, "source_dtype", "", w));
    if (const nlohmann::json* d = jsonck::member(*j, "data"); d != nullptr) {
      const jsonck::Where dw{state_where, "data"};
      DataIdentity id;
      ZINF_ASSIGN_OR_RETURN(id.path, jsonck::string_key(*d, "path", dw));
      ZINF_ASSIGN_OR_RETURN(id.source, jsonck::string_key_or(*d, "source", "", dw));
      ZINF_ASSIGN_OR_RETURN(id.tokens, jsonck::uint_key(*d, "tokens", 0, kU64, dw));
      ZINF_ASSIGN_OR_RETURN(const std::int64_t vocab, jsonck::int_key(*d, "vocab", 0, kInt, dw));
      id.vocab = static_cast<int>(vocab);
      // Checkpoints from before --data-format have no format.
      ZINF_ASSIGN_OR_RETURN(id.format, jsonck::string_key_or(*d, "format", "auto", dw));
      ZINF_ASSIGN_OR_RETURN(const std::string hash, jsonck::string_key(*d, "hash", dw));
      const auto [end, ec] = std::from_chars(hash.data(), hash.data() + hash.size(), id.hash, 16);
      if (hash.empty() || ec != std::errc() || end != hash.data() + hash.size()) {
        return jsonck::bad(dw, fmt::format("hash \"{}\" is not a hexadecimal number", hash));
      }
      r.data_ = id;
    }
    return Status::ok();
  }();
  if (!read.is_ok()) {
    return Status::corruption(fmt::format("--resume {}: client_state is malformed: {}", dir, read.message()));
  }
  return r;
}

Result<std::uint64_t> SavedRun::seed(std::optional<std::uint64_t> given, std::uint64_t fallback,
                                     const ResumeRules& rules) const {
  if (!seed_) {
    const std::uint64_t seed = given.value_or(fallback);
    if (rules.speaker) {
      log(LogLevel::kWarning, fmt::format("--resume {}: {} does not record its seed (an older checkpoint); the data "
                                          "order uses seed {}{}: give the run's --seed if it was another",
                                          dir_, tag_, seed, given ? "" : " (the default)"));
    }
    return seed;
  }
  if (!given || *given == *seed_) return *seed_;
  if (!rules.allow_data_change) {
    return Status::invalid_argument(fmt::format(
        "--resume {}: --seed {} differs from the checkpoint's seed {}, which drew the saved run's data order; leave "
        "--seed out to continue with {}, or pass --allow-data-change to continue with {} in another order",
        dir_, *given, *seed_, *seed_, *given));
  }
  if (rules.speaker) {
    log(LogLevel::kWarning, fmt::format("--resume {}: --seed {} replaces the checkpoint's seed {} "
                                        "(--allow-data-change): the rest of this epoch follows another order "
                                        "(rows may repeat or be missed)",
                                        dir_, *given, *seed_));
  }
  return *given;
}

Result<model::DataFormat> SavedRun::data_format(std::optional<model::DataFormat> given) const {
  if (given || !data_) return given.value_or(model::DataFormat::kAuto);
  auto f = model::parse_data_format(data_->format);
  if (!f.is_ok()) return f.status().with_context(fmt::format("--resume {}: {}", dir_, tag_));
  return f;
}

std::string SavedRun::data_path(const std::string& given) const {
  if (!given.empty() || !data_) return given;
  return data_->path;
}

Result<bool> SavedRun::check_data(const DataIdentity& now, bool given, const ResumeRules& rules) const {
  if (!data_) {
    if (rules.speaker) {
      log(LogLevel::kWarning, fmt::format("--resume {}: {} does not record its data (an older checkpoint); this run "
                                          "reads {}: make sure it is the data the checkpoint was trained on",
                                          dir_, tag_, now.describe()));
    }
    return false;
  }
  if (data_->same_data(now)) return false;
  const std::string saved = data_->describe();
  if (!rules.allow_data_change) {
    if (given) {
      return Status::invalid_argument(fmt::format(
          "--resume {}: --data {} is not the data the checkpoint was trained on, {}; leave --data out to read the "
          "checkpoint's data, or pass --allow-data-change to train on the new data",
          dir_, now.describe(), saved));
    }
    return Status::invalid_argument(fmt::format(
        "--resume {}: the checkpoint's data has changed since it was saved: it was {}, it is now {}; restore it, "
        "give --data with the original, or pass --allow-data-change to train on it as it is",
        dir_, saved, now.describe()));
  }
  if (rules.speaker) {
    log(LogLevel::kWarning, fmt::format("--resume {}: training on {} instead of the checkpoint's data {} "
                                        "(--allow-data-change): the batches differ from an uninterrupted run",
                                        dir_, now.describe(), saved));
  }
  return true;
}

Status SavedRun::check_batch(const BatchGeometry& now, const ResumeRules& rules) const {
  if (batch_ && batch_->seq != now.seq) {
    if (!rules.allow_data_change) {
      return Status::invalid_argument(fmt::format(
          "--resume {}: the checkpoint was trained on rows of {} tokens (--seq {}), this run has --seq {}; leave "
          "--seq out to continue with {}, or pass --allow-data-change to go on with rows of {}",
          dir_, batch_->seq, batch_->seq, now.seq, batch_->seq, now.seq));
    }
    if (rules.speaker) {
      log(LogLevel::kWarning, fmt::format("--resume {}: --seq {} replaces the checkpoint's window of {} tokens "
                                          "(--allow-data-change): the data goes on from the same share of the epoch, "
                                          "in other rows than an uninterrupted run",
                                          dir_, now.seq, batch_->seq));
    }
  }
  const std::uint64_t saved_rows = rows_per_step_.value_or(now.rows_per_step());  // older checkpoints lack it
  const std::string saved_text =
      batch_ ? fmt::format("{} ({})", saved_rows, geometry_text(*batch_)) : fmt::format("{}", saved_rows);
  if (saved_rows != now.rows_per_step()) {
    if (world_size_ == now.world_size && !rules.allow_data_change) {
      return Status::invalid_argument(fmt::format(
          "--resume {}: {} rows per step ({}) differ from the checkpoint's {}: steps would not see the batches of "
          "the saved run; use the checkpoint's batch sizes, or pass --allow-data-change",
          dir_, now.rows_per_step(), geometry_text(now), saved_text));
    }
    if (rules.speaker) {
      log(LogLevel::kWarning, fmt::format("--resume {}: saved with {} rows per step, resumed with {} ({}): the data "
                                          "continues where it stopped, but steps no longer see the batches of an "
                                          "uninterrupted run",
                                          dir_, saved_text, now.rows_per_step(), geometry_text(now)));
    }
    return Status::ok();
  }
  if (batch_ && world_size_ == now.world_size &&
      (batch_->micro_batch != now.micro_batch || batch_->grad_accum != now.grad_accum) && rules.speaker) {
    log(LogLevel::kWarning, fmt::format("--resume {}: the checkpoint's {} rows per step are now split as {} (saved: "
                                        "{}): the same batches, summed in another order (not bit-identical)",
                                        dir_, saved_rows, geometry_text(now), geometry_text(*batch_)));
  }
  return Status::ok();
}

Status SavedRun::restore_position(model::BatchLoader& loader, bool data_changed, int now_seq,
                                  const ResumeRules& rules) const {
  if (batch_ && batch_->seq != now_seq && now_seq > 0) {
    // Rows of another length: the same share of the epoch (by tokens), rounded down to a row.
    const std::uint64_t row = position_.row * static_cast<std::uint64_t>(batch_->seq) / static_cast<std::uint64_t>(now_seq);
    if (row >= loader.rows_per_epoch()) return loader.restore({position_.epoch + 1, 0});
    return loader.restore({position_.epoch, row}).with_context("--resume " + dir_);
  }
  if (data_changed && position_.row >= loader.rows_per_epoch()) {
    if (rules.speaker) {
      log(LogLevel::kWarning, fmt::format("--resume {}: the saved position (epoch {}, row {}) is past the new data's "
                                          "{} rows; continuing with epoch {} from its first row",
                                          dir_, position_.epoch, position_.row, loader.rows_per_epoch(),
                                          position_.epoch + 1));
    }
    return loader.restore({position_.epoch + 1, 0});
  }
  return loader.restore(position_).with_context("--resume " + dir_);
}

}  // namespace zinf::cli
