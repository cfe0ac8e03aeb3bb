// ds_config.json top level: batch sizes, clipping, small blocks, and the order the blocks are read in.
#include "zinf/config/ds_config.h"

#include <cctype>
#include <cerrno>
#include <fstream>
#include <sstream>
#include <vector>

#include "config/known_keys.h"
#include "config/sections.h"

namespace zinf::config {

using detail::Field;
using detail::Json;
using detail::ObjectReader;
using detail::ParseState;

std::string_view offload_device_name(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::kNone: return "none";
    case OffloadDevice::kCpu: return "cpu";
    case OffloadDevice::kNvme: return "nvme";
  }
  return "none";
}

std::string_view precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kFp16: return "fp16";
    case Precision::kBf16: return "bf16";
  }
  return "fp32";
}

const ParamValue* ParamList::find(std::string_view name) const {
  for (const Param& p : items) {
    if (p.name == name) return &p.value;
  }
  return nullptr;
}

std::optional<double> ParamList::number(std::string_view name) const {
  const ParamValue* v = find(name);
  if (v == nullptr) return std::nullopt;
  if (const double* d = std::get_if<double>(v)) return *d;
  if (const std::int64_t* i = std::get_if<std::int64_t>(v)) return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<std::int64_t> ParamList::integer(std::string_view name) const {
  const ParamValue* v = find(name);
  if (v == nullptr) return std::nullopt;
  if (const std::int64_t* i = std::get_if<std::int64_t>(v)) return *i;
  return std::nullopt;
}

std::optional<bool> ParamList::boolean(std::string_view name) const {
  const ParamValue* v = find(name);
  if (v == nullptr) return std::nullopt;
  if (const bool* b = std::get_if<bool>(v)) return *b;
  return std::nullopt;
}

std::optional<std::string> ParamList::string(std::string_view name) const {
  const ParamValue* v = find(name);
  if (v == nullptr) return std::nullopt;
  if (const std::string* s = std::get_if<std::string>(v)) return *s;
  return std::nullopt;
}

std::optional<std::vector<double>> ParamList::numbers(std::string_view name) const {
  const ParamValue* v = find(name);
  if (v == nullptr) return std::nullopt;
  if (const auto* l = std::get_if<std::vector<double>>(v)) return *l;
  return std::nullopt;
}

namespace {

// Command-line values are user input too: reject nonsense before it reaches the config.
Status check_context(const AutoContext& ctx) {
  auto bad = [](std::string_view option, std::string_view expected, auto value) {
    return Status::invalid_argument(
        fmt::format("{}: expected {}, got {}", option, expected, value));
  };
  if (ctx.world_size < 1) return bad(cli_option::kWorldSize, "a positive integer", ctx.world_size);
  if (ctx.hidden_size && *ctx.hidden_size < 1) {
    return bad(cli_option::kHiddenSize, "a positive integer", *ctx.hidden_size);
  }
  for (auto [option, v] : {std::pair{cli_option::kMicroBatch, ctx.micro_batch},
                           std::pair{cli_option::kGradAccum, ctx.grad_accum},
                           std::pair{cli_option::kTrainBatch, ctx.train_batch},
                           std::pair{cli_option::kTotalSteps, ctx.total_steps},
                           std::pair{cli_option::kSteps, ctx.run_steps}}) {
    if (v && *v < 1) return bad(option, "a positive integer", *v);
  }
  for (auto [option, v] : {std::pair{cli_option::kMicroBatch, ctx.micro_batch},
                           std::pair{cli_option::kGradAccum, ctx.grad_accum},
                           std::pair{cli_option::kTrainBatch, ctx.train_batch}}) {
    if (v && *v > detail::kBatchRange.max) {
      return bad(option, fmt::format("an integer from 1 to {}", detail::kBatchRange.max), *v);
    }
  }
  if (ctx.world_size > detail::kBatchRange.max) {
    return bad(cli_option::kWorldSize, fmt::format("an integer from 1 to {}", detail::kBatchRange.max),
               ctx.world_size);
  }
  if (ctx.warmup_steps && *ctx.warmup_steps < 0) {
    return bad(cli_option::kWarmupSteps, "a non-negative integer", *ctx.warmup_steps);
  }
  for (auto [option, v] : {std::pair{cli_option::kLr, ctx.lr},
                           std::pair{cli_option::kWeightDecay, ctx.weight_decay},
                           std::pair{cli_option::kClip, ctx.gradient_clipping}}) {
    if (v && !(*v >= 0.0)) return bad(option, "a number >= 0", detail::format_number(*v));
  }
  if (ctx.eps && !(*ctx.eps > 0.0)) return bad(cli_option::kEps, "a number > 0", *ctx.eps);
  if (ctx.betas) {
    for (double b : *ctx.betas) {
      if (!(b >= 0.0 && b < 1.0)) return bad(cli_option::kBetas, "numbers >= 0 and < 1", b);
    }
  }
  return Status::ok();
}

bool mul_overflows(std::int64_t a, std::int64_t b, std::int64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

// §8: any two of (train, micro, accumulation) determine the third with the world size.
Status derive_batch(ParseState& st, std::optional<std::int64_t> train,
                    std::optional<std::int64_t> micro, std::optional<std::int64_t> accum,
                    std::int64_t world, BatchSection* b) {
  std::int64_t product = 0;
  if (train && micro && accum) {
    if (mul_overflows(*micro, *accum, &product) || mul_overflows(product, world, &product) ||
        product != *train) {
      return st.error("train_batch_size",
                      fmt::format("{} != train_micro_batch_size_per_gpu {} * "
                                  "gradient_accumulation_steps {} * world size {}",
                                  *train, *micro, *accum, world));
    }
  } else if (train && (micro || accum)) {
    std::int64_t known = micro ? *micro : *accum;
    std::string_view known_name = micro ? "train_micro_batch_size_per_gpu" : "gradient_accumulation_steps";
    std::string_view derived_name = micro ? "gradient_accumulation_steps" : "train_micro_batch_size_per_gpu";
    if (mul_overflows(known, world, &product) || *train % product != 0) {
      return st.error("train_batch_size",
                      fmt::format("{} is not a multiple of {} {} * world size {}, so {} cannot be "
                                  "derived",
                                  *train, known_name, known, world, derived_name));
    }
    (micro ? accum : micro) = *train / product;
  } else if (micro && accum) {
    if (mul_overflows(*micro, *accum, &product) || mul_overflows(product, world, &product)) {
      return st.error("train_batch_size", "train_micro_batch_size_per_gpu * "
                                          "gradient_accumulation_steps * world size overflows");
    }
    train = product;
  } else if (train) {
    if (*train % world != 0) {
      return st.error("train_batch_size",
                      fmt::format("{} is not a multiple of the world size {}", *train, world));
    }
    accum = 1;
    micro = *train / world;
  } else if (micro) {
    if (mul_overflows(*micro, world, &product)) {
      return st.error("train_micro_batch_size_per_gpu", "times the world size overflows");
    }
    accum = 1;
    train = product;
  } else {
    return st.error("", fmt::format("no batch size: set train_batch_size or "
                                    "train_micro_batch_size_per_gpu (or pass {})",
                                    cli_option::kMicroBatch));
  }
  // The trainer counts rows in int: a derived size past that is an error, not a truncation.
  for (auto [key, v] : {std::pair{"train_batch_size", *train}, std::pair{"train_micro_batch_size_per_gpu", *micro},
                        std::pair{"gradient_accumulation_steps", *accum}}) {
    if (v > detail::kBatchRange.max) {
      return st.error(key, fmt::format("{} (train_micro_batch_size_per_gpu * gradient_accumulation_steps * world "
                                       "size) is over {}, the largest batch zinf can count",
                                       v, detail::kBatchRange.max));
    }
  }
  b->train_batch_size = *train;
  b->train_micro_batch_size_per_gpu = *micro;
  b->gradient_accumulation_steps = *accum;
  return Status::ok();
}

// A batch key: "auto" and a missing key take the command line, which may also leave it unset.
Result<std::optional<std::int64_t>> read_batch_key(ParseState& st, ObjectReader& top,
                                                   std::string_view key,
                                                   std::optional<std::int64_t> given,
                                                   std::string_view option) {
  ZINF_ASSIGN_OR_RETURN(auto f, top.integer(key, detail::kBatchRange));
  std::string path(key);
  if (f.is_auto) {
    if (given) st.note_auto(path, std::to_string(*given), std::string(option));
    return given;  // unset: derived from the other two below
  }
  if (f.present) {
    if (given && *given != f.value) {
      return st.error(path, fmt::format("the file says {} but {} says {}; make them agree or set "
                                        "the key to \"auto\"",
                                        f.value, option, *given));
    }
    return std::optional<std::int64_t>(f.value);
  }
  return given;
}

Status parse_batch(ParseState& st, ObjectReader& top, DsConfig* c) {
  const AutoContext& ctx = st.ctx();
  struct Key {
    std::string_view name;
    std::optional<std::int64_t> given;
    std::string_view option;
    std::optional<std::int64_t> value;
    bool auto_unset = false;  // "auto" with nothing on the command line: derived below
  };
  Key keys[] = {{"train_batch_size", ctx.train_batch, cli_option::kTrainBatch, {}},
                {"train_micro_batch_size_per_gpu", ctx.micro_batch, cli_option::kMicroBatch, {}},
                {"gradient_accumulation_steps", ctx.grad_accum, cli_option::kGradAccum, {}}};
  for (Key& k : keys) {
    ZINF_ASSIGN_OR_RETURN(k.value, read_batch_key(st, top, k.name, k.given, k.option));
    const Json* raw = top.raw(k.name);
    k.auto_unset = !k.value && raw != nullptr && raw->is_string();
  }
  Key& train = keys[0];
  Key& micro = keys[1];
  if (!train.value && !micro.value) {
    // Nothing to derive from: an "auto" here needs the command line (the micro-batch, from
    // which train_batch_size follows). The batch stays 0; missing options are reported together.
    Key* k = micro.auto_unset ? &micro : train.auto_unset ? &train : nullptr;
    // A file with no batch key at all was written for a trainer that fills it (HF's legacy
    // examples): under trainer_defaults it gets the Trainer's batch, as an "auto" would.
    const bool none_present = top.raw(keys[0].name) == nullptr && top.raw(keys[1].name) == nullptr &&
                              top.raw(keys[2].name) == nullptr;
    if ((k != nullptr || none_present) && ctx.trainer_defaults) {
      // The Trainer's per-device batch; gradient_accumulation_steps follows below (its own
      // "auto" takes the Trainer's 1 when nothing else decides it).
      micro.value = TrainerDefaults::kMicroBatch;
      st.note_auto("train_micro_batch_size_per_gpu", std::to_string(*micro.value),
                   detail::trainer_default_source(micro.option));
      Key& accum = keys[2];
      if (!accum.value && (accum.auto_unset || top.raw(accum.name) == nullptr)) {
        accum.value = TrainerDefaults::kGradAccum;
        if (accum.auto_unset) {
          st.note_auto("gradient_accumulation_steps", std::to_string(*accum.value),
                       detail::trainer_default_source(accum.option));
          accum.auto_unset = false;
        }
      }
      micro.auto_unset = false;
      k = nullptr;
    }
    if (k != nullptr) {
      std::string option = k == &micro ? std::string(micro.option)
                                       : fmt::format("{} or {}", micro.option, train.option);
      st.need_option(std::string(k->name), option,
                     fmt::format("is \"auto\", which takes its value from the command line; pass {}",
                                 option));
      return Status::ok();
    }
  }
  ZINF_RETURN_IF_ERROR(derive_batch(st, keys[0].value, keys[1].value, keys[2].value,
                                    ctx.world_size, &c->batch));
  const std::int64_t derived[] = {c->batch.train_batch_size,
                                  c->batch.train_micro_batch_size_per_gpu,
                                  c->batch.gradient_accumulation_steps};
  for (int i = 0; i < 3; ++i) {
    if (keys[i].auto_unset) {
      st.note_auto(std::string(keys[i].name), std::to_string(derived[i]),
                   "train_batch_size = train_micro_batch_size_per_gpu * "
                   "gradient_accumulation_steps * world size");
    }
  }
  return Status::ok();
}

Status parse_checkpoint(ParseState& st, const Json* obj, CheckpointSection* cp) {
  ObjectReader r(st, obj, "checkpoint");
  ZINF_ASSIGN_OR_RETURN(auto local, r.boolean("use_node_local_storage"));
  detail::take_or_default(st, r.key_path("use_node_local_storage"), local,
                          &cp->use_node_local_storage);
  r.ignore(detail::ignored_checkpoint_keys());
  return r.finish();
}

// The zinf-only block: {"host_memory_budget": bytes or "6GiB"}.
Status parse_zinf(ParseState& st, const Json* obj, ZinfSection* z) {
  ObjectReader r(st, obj, "zinf");
  if (const Json* v = r.raw("host_memory_budget"); v != nullptr && !v->is_null()) {
    if (v->is_string()) {
      Result<std::uint64_t> bytes = parse_byte_size(v->get<std::string>());
      if (!bytes.is_ok()) return r.error("host_memory_budget", bytes.status().message());
      z->host_memory_budget = bytes.value();
    } else {
      ZINF_ASSIGN_OR_RETURN(auto n, r.integer("host_memory_budget", detail::kPositive));
      if (n.has_value()) z->host_memory_budget = static_cast<std::uint64_t>(n.value);
    }
  }
  return r.finish();
}

Status parse_activation_checkpointing(ParseState& st, const Json* obj,
                                      ActivationCheckpointingSection* ac) {
  if (obj == nullptr) return Status::ok();
  ObjectReader r(st, obj, "activation_checkpointing");
  ac->present = true;
  for (auto [key, out] :
       {std::pair{"partition_activations", &ac->partition_activations},
        std::pair{"cpu_checkpointing", &ac->cpu_checkpointing},
        std::pair{"contiguous_memory_optimization", &ac->contiguous_memory_optimization},
        std::pair{"synchronize_checkpoint_boundary", &ac->synchronize_checkpoint_boundary},
        std::pair{"profile", &ac->profile}}) {
    ZINF_ASSIGN_OR_RETURN(auto f, r.boolean(key));
    detail::take_or_default(st, r.key_path(key), f, out);
  }
  ZINF_ASSIGN_OR_RETURN(auto n, r.integer("number_checkpoints", detail::kPositive));
  if (n.has_value()) ac->number_checkpoints = n.value;
  ZINF_RETURN_IF_ERROR(r.finish());
  st.warn("activation_checkpointing", "turns on zinf's own scheme (each transformer block is "
                                      "recomputed in backward); the block's options are ignored");
  return Status::ok();
}

Status parse_small_top_level(ParseState& st, ObjectReader& top, DsConfig* c) {
  ZINF_ASSIGN_OR_RETURN(auto clip, top.number("gradient_clipping", detail::NumberRange{0.0}));
  ZINF_RETURN_IF_ERROR(detail::take_from_context(st, "gradient_clipping", clip,
                                                 st.ctx().gradient_clipping, cli_option::kClip,
                                                 &c->gradient_clipping,
                                                 std::optional<double>(TrainerDefaults::kGradientClipping)));
  ZINF_ASSIGN_OR_RETURN(auto spp, top.integer("steps_per_print", detail::kPositive));
  detail::take_or_default(st, "steps_per_print", spp, &c->steps_per_print);
  for (auto [key, out] :
       {std::pair{"wall_clock_breakdown", &c->wall_clock_breakdown},
        std::pair{"zero_allow_untested_optimizer", &c->zero_allow_untested_optimizer},
        std::pair{"zero_force_ds_cpu_optimizer", &c->zero_force_ds_cpu_optimizer}}) {
    ZINF_ASSIGN_OR_RETURN(auto f, top.boolean(key));
    detail::take_or_default(st, key, f, out);
  }
  ZINF_ASSIGN_OR_RETURN(auto comm, top.string("communication_data_type"));
  if (comm.has_value()) {
    std::string v = comm.value;
    for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (v != "fp32" && v != "fp16" && v != "bf16") {
      return top.error("communication_data_type",
                       fmt::format("expected one of \"fp32\", \"fp16\", \"bf16\", got \"{}\"",
                                   comm.value));
    }
    c->communication_data_type = v;
  } else if (comm.is_auto) {
    st.note_auto("communication_data_type", "null", "by precision, the reference default");
  }
  return Status::ok();
}

Status parse_blocks(ParseState& st, ObjectReader& top, DsConfig* c) {
  ZINF_RETURN_IF_ERROR(parse_batch(st, top, c));
  ZINF_RETURN_IF_ERROR(parse_small_top_level(st, top, c));
  ZINF_ASSIGN_OR_RETURN(const Json* optimizer, top.object("optimizer"));
  ZINF_RETURN_IF_ERROR(detail::parse_optimizer(st, optimizer, &c->optimizer));
  ZINF_ASSIGN_OR_RETURN(const Json* scheduler, top.object("scheduler"));
  ZINF_RETURN_IF_ERROR(detail::parse_scheduler(st, scheduler, &c->scheduler));
  ZINF_RETURN_IF_ERROR(detail::parse_precision(st, top, &c->fp16, &c->bf16));

  const Json* nested_aio = nullptr;
  ZINF_RETURN_IF_ERROR(detail::parse_zero(st, top, &c->zero, &nested_aio));
  ZINF_ASSIGN_OR_RETURN(const Json* aio, top.object("aio"));
  if (nested_aio != nullptr) {
    if (aio != nullptr) {
      return st.error("zero_optimization.aio", "an aio block is given here and at the top level; "
                                               "keep the top-level one");
    }
    st.warn("zero_optimization.aio", "belongs at the top level (DeepSpeed rejects it here); "
                                     "read as the top-level aio block");
    ZINF_RETURN_IF_ERROR(detail::parse_aio(st, nested_aio, "zero_optimization.aio", &c->aio));
  } else {
    ZINF_RETURN_IF_ERROR(detail::parse_aio(st, aio, "aio", &c->aio));
  }
  c->aio.present = aio != nullptr || nested_aio != nullptr;
  ZINF_ASSIGN_OR_RETURN(const Json* checkpoint, top.object("checkpoint"));
  ZINF_RETURN_IF_ERROR(parse_checkpoint(st, checkpoint, &c->checkpoint));
  ZINF_ASSIGN_OR_RETURN(const Json* ac, top.object("activation_checkpointing"));
  ZINF_RETURN_IF_ERROR(parse_activation_checkpointing(st, ac, &c->activation_checkpointing));
  ZINF_ASSIGN_OR_RETURN(const Json* zinf, top.object("zinf"));
  ZINF_RETURN_IF_ERROR(parse_zinf(st, zinf, &c->zinf));
  top.ignore(detail::ignored_top_level_keys());
  return top.finish();
}

}  // namespace

Result<std::uint64_t> parse_byte_size(std::string_view text) {
  const std::string s(text);
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = s.substr(used);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (!unit.empty() && unit.back() == 'I') unit.pop_back();
  const std::string units = "KMGT";
  double scale = 1;
  if (unit.size() == 1 && units.find(unit[0]) != std::string::npos) {
    scale = static_cast<double>(std::uint64_t{1} << (10 * (units.find(unit[0]) + 1)));
  } else if (!unit.empty() || used == 0) {
    used = 0;
  }
  if (used == 0 || !(v > 0) || v * scale >= 1.8e19) {
    return Status::invalid_argument(
        fmt::format("expected a positive size such as 6GiB, 512M or 1073741824, got \"{}\"", s));
  }
  return static_cast<std::uint64_t>(v * scale);
}

Result<DsConfig> parse_ds_config(std::string_view text, std::string_view source_name,
                                 const AutoContext& ctx) {
  ZINF_RETURN_IF_ERROR(check_context(ctx));
  ZINF_ASSIGN_OR_RETURN(detail::ParsedText parsed, detail::parse_json_text(text, source_name));
  if (!parsed.root.is_object()) {
    return Status::invalid_argument(fmt::format("{}: the top level must be an object {{...}}, got {}",
                                                source_name, detail::describe_value(parsed.root)));
  }
  ParseState st(std::string(source_name), text, parsed.keys, ctx);
  DsConfig c;
  c.source = std::string(source_name);
  c.world_size = ctx.world_size;
  ObjectReader top(st, &parsed.root, "");
  ZINF_RETURN_IF_ERROR(parse_blocks(st, top, &c));
  ZINF_RETURN_IF_ERROR(st.missing_options_error());
  c.warnings = st.take_warnings();
  c.auto_resolved = st.take_auto_resolved();
  return c;
}

Result<DsConfig> load_ds_config(const std::string& path, const AutoContext& ctx) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::sys_error(fmt::format("{}: cannot open", path), errno);
  // Read in pieces and stop past the cap, so a huge (or endless, e.g. /dev/zero) file costs
  // at most the cap in memory.
  std::string text;
  std::vector<char> piece(std::size_t{1} << 16);
  while (in.read(piece.data(), static_cast<std::streamsize>(piece.size())) || in.gcount() > 0) {
    text.append(piece.data(), static_cast<std::size_t>(in.gcount()));
    if (text.size() > detail::kMaxConfigBytes) {
      return Status::invalid_argument(fmt::format("{}: more than {} bytes; a config may hold at most {} bytes (16 MiB)",
                                                  path, detail::kMaxConfigBytes, detail::kMaxConfigBytes));
    }
  }
  if (in.bad()) return Status::sys_error(fmt::format("{}: cannot read", path), errno);
  return parse_ds_config(text, path, ctx);
}

}  // namespace zinf::config
