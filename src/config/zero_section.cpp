// zero_optimization, offload_param, offload_optimizer and aio: aliases, deprecated names, checks.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "config/known_keys.h"
#include "config/sections.h"

namespace zinf::config::detail {

namespace {

Result<OffloadDevice> read_device(ParseState& st, ObjectReader& r) {
  ZINF_ASSIGN_OR_RETURN(Field<std::string> f, r.choice("device", {"none", "cpu", "nvme"}));
  std::string name = "none";
  take_or_default(st, r.key_path("device"), f, &name);
  if (name == "cpu") return OffloadDevice::kCpu;
  if (name == "nvme") return OffloadDevice::kNvme;
  return OffloadDevice::kNone;
}

// nvme_path must name an existing folder this process can write to.
Status check_nvme_path(ParseState& st, const std::string& block, OffloadDevice device,
                       const std::string& nvme_path) {
  std::string key = block + ".nvme_path";
  if (device != OffloadDevice::kNvme) {
    if (!nvme_path.empty()) st.warn(key, "is ignored: device is not \"nvme\"");
    return Status::ok();
  }
  if (nvme_path.empty()) return st.error(key, "required when device is \"nvme\"");
  struct stat sb;
  if (::stat(nvme_path.c_str(), &sb) != 0) {
    int e = errno;
    return st.error(key, fmt::format("\"{}\" {}", nvme_path,
                                     e == ENOENT ? "does not exist" : std::strerror(e)));
  }
  if (!S_ISDIR(sb.st_mode)) return st.error(key, fmt::format("\"{}\" is not a directory", nvme_path));
  if (::access(nvme_path.c_str(), W_OK | X_OK) != 0) {
    return st.error(key, fmt::format("\"{}\" is not writable ({})", nvme_path, std::strerror(errno)));
  }
  return Status::ok();
}

Status parse_offload_param(ParseState& st, const Json* obj, const std::string& path,
                           OffloadParamSection* p) {
  ObjectReader r(st, obj, path);
  ZINF_ASSIGN_OR_RETURN(p->device, read_device(st, r));
  ZINF_ASSIGN_OR_RETURN(auto nvme, r.string("nvme_path"));
  take_or_default(st, r.key_path("nvme_path"), nvme, &p->nvme_path);
  ZINF_ASSIGN_OR_RETURN(auto pin, r.boolean("pin_memory"));
  take_or_default(st, r.key_path("pin_memory"), pin, &p->pin_memory);
  ZINF_ASSIGN_OR_RETURN(auto count, r.integer("buffer_count", kPositive));
  take_or_default(st, r.key_path("buffer_count"), count, &p->buffer_count);
  ZINF_ASSIGN_OR_RETURN(auto size, r.integer("buffer_size", kPositive));
  take_or_default(st, r.key_path("buffer_size"), size, &p->buffer_size);
  ZINF_ASSIGN_OR_RETURN(auto max_in_cpu, r.integer("max_in_cpu", kNonNegative));
  take_or_default(st, r.key_path("max_in_cpu"), max_in_cpu, &p->max_in_cpu);
  ZINF_RETURN_IF_ERROR(r.finish());
  return check_nvme_path(st, path, p->device, p->nvme_path);
}

Status parse_offload_optimizer(ParseState& st, const Json* obj, const std::string& path,
                               OffloadOptimizerSection* o) {
  ObjectReader r(st, obj, path);
  ZINF_ASSIGN_OR_RETURN(o->device, read_device(st, r));
  ZINF_ASSIGN_OR_RETURN(auto nvme, r.string("nvme_path"));
  take_or_default(st, r.key_path("nvme_path"), nvme, &o->nvme_path);
  ZINF_ASSIGN_OR_RETURN(auto pin, r.boolean("pin_memory"));
  take_or_default(st, r.key_path("pin_memory"), pin, &o->pin_memory);
  ZINF_ASSIGN_OR_RETURN(auto count, r.integer("buffer_count", kPositive));
  take_or_default(st, r.key_path("buffer_count"), count, &o->buffer_count);
  for (auto [key, out] : {std::pair{"pipeline_read", &o->pipeline_read},
                          std::pair{"pipeline_write", &o->pipeline_write},
                          std::pair{"fast_init", &o->fast_init}}) {
    ZINF_ASSIGN_OR_RETURN(auto f, r.boolean(key));
    take_or_default(st, r.key_path(key), f, out);
  }
  ZINF_ASSIGN_OR_RETURN(auto ratio, r.number("ratio", NumberRange{0.0, 1.0}));
  take_or_default(st, r.key_path("ratio"), ratio, &o->ratio);
  r.ignore(ignored_offload_optimizer_keys());
  ZINF_RETURN_IF_ERROR(r.finish());
  return check_nvme_path(st, path, o->device, o->nvme_path);
}

// Which of `name` and its `stage3_` alias the file uses; both is an error.
Result<std::string> pick_alias(ObjectReader& r, const std::string& name) {
  std::string alias = "stage3_" + name;
  bool has_name = r.has(name);
  bool has_alias = r.has(alias);
  if (has_name && has_alias) {
    return r.error(alias, fmt::format("'{}' and its alias '{}' are both given; keep one", name, alias));
  }
  return has_alias ? alias : name;
}

// An element-count knob with its stage3_ alias; "auto" uses `formula` (when set) at stage 3.
Status read_stage3_count(ParseState& st, ObjectReader& r, const std::string& name, int stage,
                         std::optional<std::int64_t> formula, std::string_view formula_text,
                         std::int64_t* out) {
  ZINF_ASSIGN_OR_RETURN(std::string key, pick_alias(r, name));
  ZINF_ASSIGN_OR_RETURN(auto f, r.integer(key, kNonNegative));
  if (f.is_auto && !formula_text.empty() && stage == 3) {
    if (!formula) {
      st.need_option(r.key_path(key), fmt::format("{} (or --model)", cli_option::kHiddenSize),
                     fmt::format("is \"auto\", which is {} from the model; pass {} (or --model)",
                                 formula_text, cli_option::kHiddenSize));
      return Status::ok();
    }
    *out = *formula;
    st.note_auto(r.key_path(key), value_text(*out), std::string(formula_text));
    return Status::ok();
  }
  take_or_default(st, r.key_path(key), f, out);
  return Status::ok();
}

// The deprecated boolean switches cpu_offload / cpu_offload_param / cpu_offload_use_pin_memory.
Status apply_deprecated_offload(ParseState& st, ObjectReader& r, ZeroSection* z,
                                bool has_offload_param, bool has_offload_optimizer) {
  ZINF_ASSIGN_OR_RETURN(auto cpu_offload, r.boolean("cpu_offload"));
  ZINF_ASSIGN_OR_RETURN(auto cpu_offload_param, r.boolean("cpu_offload_param"));
  ZINF_ASSIGN_OR_RETURN(auto use_pin, r.boolean("cpu_offload_use_pin_memory"));
  if (cpu_offload.present) {
    if (has_offload_optimizer) {
      return r.error("cpu_offload", "deprecated name of offload_optimizer, and offload_optimizer "
                                    "is given too; keep offload_optimizer");
    }
    st.warn(r.key_path("cpu_offload"), "is deprecated; read as offload_optimizer {\"device\": "
                                       "\"cpu\"} when true");
    if (cpu_offload.has_value() && cpu_offload.value) z->offload_optimizer.device = OffloadDevice::kCpu;
  }
  if (cpu_offload_param.present) {
    if (has_offload_param) {
      return r.error("cpu_offload_param", "deprecated name of offload_param, and offload_param "
                                          "is given too; keep offload_param");
    }
    st.warn(r.key_path("cpu_offload_param"), "is deprecated; read as offload_param {\"device\": "
                                             "\"cpu\"} when true");
    if (cpu_offload_param.has_value() && cpu_offload_param.value) {
      z->offload_param.device = OffloadDevice::kCpu;
    }
  }
  if (use_pin.present) {
    if (has_offload_param || has_offload_optimizer) {
      return r.error("cpu_offload_use_pin_memory",
                     "deprecated; with offload_param/offload_optimizer blocks set their "
                     "pin_memory instead");
    }
    st.warn(r.key_path("cpu_offload_use_pin_memory"),
            "is deprecated; read as pin_memory of the offload blocks made from cpu_offload and "
            "cpu_offload_param");
    if (use_pin.has_value()) {
      z->offload_param.pin_memory = use_pin.value;
      z->offload_optimizer.pin_memory = use_pin.value;
    }
  }
  return Status::ok();
}

Status read_gather_16bit(ParseState& st, ObjectReader& r, ZeroSection* z) {
  constexpr std::string_view kOld = "stage3_gather_fp16_weights_on_model_save";
  ZINF_ASSIGN_OR_RETURN(std::string key, pick_alias(r, "gather_16bit_weights_on_model_save"));
  bool has_new = r.has(key);
  if (r.has(kOld)) {
    if (has_new) {
      return r.error(kOld, fmt::format("deprecated name of {}, which is given too; keep {}", key, key));
    }
    st.warn(r.key_path(kOld), "is deprecated; read as gather_16bit_weights_on_model_save");
    key = std::string(kOld);
  }
  ZINF_ASSIGN_OR_RETURN(auto f, r.boolean(key));
  take_or_default(st, r.key_path(key), f, &z->gather_16bit_weights_on_model_save);
  return Status::ok();
}

Status parse_zero_object(ParseState& st, const Json* obj, ZeroSection* z, const Json** nested_aio) {
  ObjectReader r(st, obj, "zero_optimization");
  ZINF_ASSIGN_OR_RETURN(auto stage, r.integer("stage", IntRange{0, 3}));
  std::int64_t stage_value = z->stage;
  take_or_default(st, r.key_path("stage"), stage, &stage_value);
  z->stage = static_cast<int>(stage_value);
  z->overlap_comm = z->stage == 3;
  ZINF_ASSIGN_OR_RETURN(auto overlap, r.boolean("overlap_comm"));
  take_or_default(st, r.key_path("overlap_comm"), overlap, &z->overlap_comm);
  ZINF_ASSIGN_OR_RETURN(auto contiguous, r.boolean("contiguous_gradients"));
  take_or_default(st, r.key_path("contiguous_gradients"), contiguous, &z->contiguous_gradients);

  std::optional<std::int64_t> h = st.ctx().hidden_size;
  // DeepSpeed's "auto" values for stage 3, from the model's hidden size.
  std::optional<std::int64_t> auto_reduce_bucket, auto_prefetch_bucket, auto_persistence_threshold;
  if (h) {
    auto_reduce_bucket = *h * *h;
    auto_prefetch_bucket = static_cast<std::int64_t>(std::floor(0.9 * double(*h) * double(*h)));
    auto_persistence_threshold = 10 * *h;
  }
  ZINF_ASSIGN_OR_RETURN(auto reduce, r.integer("reduce_bucket_size", kNonNegative));
  if (reduce.is_auto && z->stage == 3) {
    if (!auto_reduce_bucket) {
      st.need_option(r.key_path("reduce_bucket_size"),
                     fmt::format("{} (or --model)", cli_option::kHiddenSize),
                     fmt::format("is \"auto\", which is hidden_size * hidden_size from the model; "
                                 "pass {} (or --model)",
                                 cli_option::kHiddenSize));
    } else {
      z->reduce_bucket_size = *auto_reduce_bucket;
      st.note_auto(r.key_path("reduce_bucket_size"), value_text(*auto_reduce_bucket), "hidden_size * hidden_size");
    }
  } else {
    take_or_default(st, r.key_path("reduce_bucket_size"), reduce, &z->reduce_bucket_size);
  }
  // 0 is the reference's "one parameter (here: one partition group) per sub-group".
  ZINF_ASSIGN_OR_RETURN(auto sub_group, r.integer("sub_group_size", kNonNegative));
  take_or_default(st, r.key_path("sub_group_size"), sub_group, &z->sub_group_size);

  ZINF_RETURN_IF_ERROR(read_stage3_count(st, r, "prefetch_bucket_size", z->stage, auto_prefetch_bucket,
                                         "floor(0.9 * hidden_size * hidden_size)",
                                         &z->prefetch_bucket_size));
  ZINF_RETURN_IF_ERROR(read_stage3_count(st, r, "param_persistence_threshold", z->stage,
                                         auto_persistence_threshold,
                                         "10 * hidden_size", &z->param_persistence_threshold));
  ZINF_RETURN_IF_ERROR(read_stage3_count(st, r, "model_persistence_threshold", z->stage, {}, "",
                                         &z->model_persistence_threshold));
  ZINF_RETURN_IF_ERROR(read_stage3_count(st, r, "max_live_parameters", z->stage, {}, "",
                                         &z->max_live_parameters));
  ZINF_RETURN_IF_ERROR(read_stage3_count(st, r, "max_reuse_distance", z->stage, {}, "",
                                         &z->max_reuse_distance));
  ZINF_RETURN_IF_ERROR(read_gather_16bit(st, r, z));

  ZINF_ASSIGN_OR_RETURN(const Json* offload_param, r.object("offload_param"));
  ZINF_ASSIGN_OR_RETURN(const Json* offload_optimizer, r.object("offload_optimizer"));
  ZINF_RETURN_IF_ERROR(apply_deprecated_offload(st, r, z, offload_param != nullptr,
                                                offload_optimizer != nullptr));
  if (offload_param != nullptr) {
    ZINF_RETURN_IF_ERROR(parse_offload_param(st, offload_param, r.key_path("offload_param"),
                                             &z->offload_param));
  }
  if (offload_optimizer != nullptr) {
    ZINF_RETURN_IF_ERROR(parse_offload_optimizer(st, offload_optimizer,
                                                 r.key_path("offload_optimizer"),
                                                 &z->offload_optimizer));
  }
  ZINF_ASSIGN_OR_RETURN(*nested_aio, r.object("aio"));
  r.ignore(ignored_zero_keys());
  return r.finish();
}

// Rules that tie the zero_optimization values together.
Status check_zero(ParseState& st, const ZeroSection& z) {
  if (z.offload_param.device != OffloadDevice::kNone && z.stage < 3) {
    return st.error("zero_optimization.offload_param",
                    fmt::format("parameter offload needs ZeRO stage 3, but zero_optimization.stage "
                                "is {}",
                                z.stage));
  }
  if (z.offload_optimizer.device == OffloadDevice::kNvme && z.stage < 3) {
    return st.error("zero_optimization.offload_optimizer",
                    fmt::format("optimizer offload to NVMe needs ZeRO stage 3, but "
                                "zero_optimization.stage is {}",
                                z.stage));
  }
  if (z.offload_optimizer.ratio < 1.0 && z.stage != 3) {
    return st.error("zero_optimization.offload_optimizer.ratio",
                    fmt::format("partial optimizer offload (ratio < 1) needs ZeRO stage 3, but "
                                "zero_optimization.stage is {}",
                                z.stage));
  }
  return Status::ok();
}

}  // namespace

Status parse_zero(ParseState& st, ObjectReader& top, ZeroSection* zero, const Json** nested_aio) {
  *nested_aio = nullptr;
  const Json* raw = top.raw("zero_optimization");
  if (raw != nullptr && raw->is_boolean()) {
    // The oldest format: "zero_optimization": true meant stage 1.
    zero->stage = raw->get<bool>() ? 1 : 0;
    st.warn("zero_optimization", fmt::format("the boolean form is deprecated; read as {{\"stage\": "
                                             "{}}}",
                                             zero->stage));
    return Status::ok();
  }
  ZINF_ASSIGN_OR_RETURN(const Json* obj, top.object("zero_optimization"));
  ZINF_RETURN_IF_ERROR(parse_zero_object(st, obj, zero, nested_aio));
  return check_zero(st, *zero);
}

// The limits of zinf's aio engine (zinf::aio::AioConfig::validate is the authority; these are
// repeated so that `zinf config check` rejects what the engine would refuse at start-up).
constexpr std::int64_t kAioPage = 4096;
constexpr IntRange kAioBlockSize{kAioPage, std::int64_t{1} << 30};
constexpr IntRange kAioQueueDepth{1, 1024};
constexpr IntRange kAioParallelism{1, 64};

Status parse_aio(ParseState& st, const Json* obj, const std::string& path, AioSection* aio) {
  ObjectReader r(st, obj, path);
  ZINF_ASSIGN_OR_RETURN(auto block, r.integer("block_size", kAioBlockSize));
  if (block.has_value() && block.value % kAioPage != 0) {
    return r.error("block_size", fmt::format("expected a multiple of {} (whole pages, for O_DIRECT), "
                                             "got {}",
                                             kAioPage, block.value));
  }
  take_or_default(st, r.key_path("block_size"), block, &aio->block_size);
  ZINF_ASSIGN_OR_RETURN(auto depth, r.integer("queue_depth", kAioQueueDepth));
  take_or_default(st, r.key_path("queue_depth"), depth, &aio->queue_depth);
  std::string parallel_key = "intra_op_parallelism";
  if (r.has("thread_count")) {
    if (r.has("intra_op_parallelism")) {
      return r.error("thread_count", "deprecated name of intra_op_parallelism, which is given "
                                     "too; keep intra_op_parallelism");
    }
    st.warn(r.key_path("thread_count"), "is deprecated; read as intra_op_parallelism");
    parallel_key = "thread_count";
  }
  ZINF_ASSIGN_OR_RETURN(auto parallel, r.integer(parallel_key, kAioParallelism));
  take_or_default(st, r.key_path(parallel_key), parallel, &aio->intra_op_parallelism);
  for (auto [key, out] : {std::pair{"single_submit", &aio->single_submit},
                          std::pair{"overlap_events", &aio->overlap_events},
                          std::pair{"use_gds", &aio->use_gds}}) {
    ZINF_ASSIGN_OR_RETURN(auto f, r.boolean(key));
    take_or_default(st, r.key_path(key), f, out);
  }
  // zinf's own key (the reference has no deadline): a stuck request becomes an error.
  ZINF_ASSIGN_OR_RETURN(auto timeout, r.number("request_timeout_s", NumberRange{0.0, 1e9, true, false}));
  take_or_default(st, r.key_path("request_timeout_s"), timeout, &aio->request_timeout_s);
  r.ignore(ignored_aio_keys());
  return r.finish();
}

}  // namespace zinf::config::detail
