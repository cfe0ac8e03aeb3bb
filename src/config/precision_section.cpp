// fp16 and bf16 blocks: loss-scaling knobs, the old "bfloat16" name, "enabled": "auto".
#include "config/known_keys.h"
#include "config/sections.h"

namespace zinf::config::detail {

namespace {

// "enabled" follows --precision when given: "auto" and a missing key take it (fp16.enabled is
// true for fp16, bf16.enabled for bf16), and an explicit value must agree with it.
Status read_enabled(ParseState& st, ObjectReader& r, Precision mine, bool* enabled) {
  ZINF_ASSIGN_OR_RETURN(auto f, r.boolean("enabled"));
  const std::optional<Precision>& given = st.ctx().precision;
  std::string option = given ? fmt::format("{} {}", cli_option::kPrecision, precision_name(*given)) : "";
  if (f.is_auto) {
    if (!given && st.ctx().trainer_defaults) {
      *enabled = false;  // the Trainer's fp16=False, bf16=False
      st.note_auto(r.key_path("enabled"), value_text(false),
                   trainer_default_source(fmt::format("{} fp32|fp16|bf16", cli_option::kPrecision)));
      return Status::ok();
    }
    if (!given) {
      std::string option = fmt::format("{} fp32|fp16|bf16", cli_option::kPrecision);
      st.need_option(r.key_path("enabled"), option,
                     fmt::format("is \"auto\", which follows the command-line precision; pass {}",
                                 option));
      return Status::ok();
    }
    *enabled = *given == mine;
    st.note_auto(r.key_path("enabled"), value_text(*enabled), option);
    return Status::ok();
  }
  if (f.present) {
    if (given && f.value != (*given == mine)) {
      return r.error("enabled", fmt::format("is {}, but the command line says {}; make them agree "
                                            "or set the key to \"auto\"",
                                            value_text(f.value), option));
    }
    *enabled = f.value;
    return Status::ok();
  }
  if (given) *enabled = *given == mine;
  return Status::ok();
}

Status parse_fp16(ParseState& st, const Json* obj, Fp16Section* fp16) {
  ObjectReader r(st, obj, "fp16");
  ZINF_RETURN_IF_ERROR(read_enabled(st, r, Precision::kFp16, &fp16->enabled));
  ZINF_ASSIGN_OR_RETURN(auto scale, r.number("loss_scale", NumberRange{0.0}));
  take_or_default(st, r.key_path("loss_scale"), scale, &fp16->loss_scale);
  ZINF_ASSIGN_OR_RETURN(auto power, r.integer("initial_scale_power", IntRange{0, 63}));
  take_or_default(st, r.key_path("initial_scale_power"), power, &fp16->initial_scale_power);
  ZINF_ASSIGN_OR_RETURN(auto window, r.integer("loss_scale_window", kPositive));
  take_or_default(st, r.key_path("loss_scale_window"), window, &fp16->loss_scale_window);
  ZINF_ASSIGN_OR_RETURN(auto hysteresis, r.integer("hysteresis", kPositive));
  take_or_default(st, r.key_path("hysteresis"), hysteresis, &fp16->hysteresis);
  ZINF_ASSIGN_OR_RETURN(auto consecutive, r.boolean("consecutive_hysteresis"));
  take_or_default(st, r.key_path("consecutive_hysteresis"), consecutive,
                  &fp16->consecutive_hysteresis);
  ZINF_ASSIGN_OR_RETURN(auto min_scale,
                        r.number("min_loss_scale", NumberRange{0.0, kInf, /*min_exclusive=*/true}));
  take_or_default(st, r.key_path("min_loss_scale"), min_scale, &fp16->min_loss_scale);
  r.ignore(ignored_fp16_keys());
  return r.finish();
}

Status parse_bf16(ParseState& st, const Json* obj, const std::string& path, Bf16Section* bf16) {
  ObjectReader r(st, obj, path);
  ZINF_RETURN_IF_ERROR(read_enabled(st, r, Precision::kBf16, &bf16->enabled));
  r.ignore(ignored_bf16_keys());
  return r.finish();
}

}  // namespace

Status parse_precision(ParseState& st, ObjectReader& top, Fp16Section* fp16, Bf16Section* bf16) {
  // Both blocks are read even when absent, so that --precision reaches them.
  ZINF_ASSIGN_OR_RETURN(const Json* fp16_obj, top.object("fp16"));
  ZINF_RETURN_IF_ERROR(parse_fp16(st, fp16_obj, fp16));

  ZINF_ASSIGN_OR_RETURN(const Json* bf16_obj, top.object("bf16"));
  ZINF_ASSIGN_OR_RETURN(const Json* old_obj, top.object("bfloat16"));
  std::string bf16_path = "bf16";
  if (old_obj != nullptr) {
    if (bf16_obj != nullptr) {
      return top.error("bfloat16", "old name of bf16, which is given too; keep bf16");
    }
    st.warn("bfloat16", "is the old name of bf16; read as bf16");
    bf16_obj = old_obj;
    bf16_path = "bfloat16";
  }
  ZINF_RETURN_IF_ERROR(parse_bf16(st, bf16_obj, bf16_path, bf16));

  if (fp16->enabled && bf16->enabled) {
    return st.error(bf16_path + ".enabled", "fp16 and bf16 are both enabled; enable at most one");
  }
  return Status::ok();
}

}  // namespace zinf::config::detail
