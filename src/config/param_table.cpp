// Reads optimizer/scheduler params from a table: types, ranges, defaults, "auto" and the command line.
#include "config/param_table.h"

#include <limits>

#include "config/sections.h"

namespace zinf::config::detail {

namespace {

std::string_view option_of(ParamSource s) {
  switch (s) {
    case ParamSource::kLr: return cli_option::kLr;
    case ParamSource::kBetas: return cli_option::kBetas;
    case ParamSource::kEps: return cli_option::kEps;
    case ParamSource::kWeightDecay: return cli_option::kWeightDecay;
    case ParamSource::kWarmupSteps: return cli_option::kWarmupSteps;
    case ParamSource::kTotalSteps: return cli_option::kTotalSteps;
    default: return "";
  }
}

std::optional<double> number_from(const AutoContext& ctx, ParamSource s) {
  switch (s) {
    case ParamSource::kLr: return ctx.lr;
    case ParamSource::kEps: return ctx.eps;
    case ParamSource::kWeightDecay: return ctx.weight_decay;
    default: return std::nullopt;
  }
}

// What an unfilled "auto" of this source resolves to under AutoContext::trainer_defaults.
std::optional<double> trainer_number(ParamSource s) {
  switch (s) {
    case ParamSource::kLr: return TrainerDefaults::kLr;
    case ParamSource::kEps: return TrainerDefaults::kEps;
    case ParamSource::kWeightDecay: return TrainerDefaults::kWeightDecay;
    default: return std::nullopt;
  }
}

std::optional<std::int64_t> trainer_int(ParamSource s) {
  if (s == ParamSource::kWarmupSteps) return TrainerDefaults::kWarmupSteps;
  return std::nullopt;  // total_num_steps: from --steps (zinf train) or --total-steps only
}

std::optional<std::int64_t> int_from(const AutoContext& ctx, ParamSource s) {
  switch (s) {
    case ParamSource::kWarmupSteps: return ctx.warmup_steps;
    case ParamSource::kTotalSteps: return ctx.total_steps;
    default: return std::nullopt;
  }
}

// A value without a command-line source: "auto" is the default (or 0 for kZero sources).
template <typename T>
Status resolve_plain(ParseState& st, const ParamSpec& s, const std::string& path,
                     const Field<T>& f, T def, std::string_view owner, ParamList* out) {
  if (!f.present && s.presence == Presence::kRequired) {
    return st.error(path, fmt::format("required for {}", owner));
  }
  if (!f.present && s.presence == Presence::kOptional) return Status::ok();
  T value = def;
  if (f.is_auto && s.source == ParamSource::kZero) {
    value = T{};
    st.note_auto(path, value_text(value), "0, as the Hugging Face integration fills it");
  } else if (f.is_auto) {
    if (s.presence != Presence::kDefault) {
      return st.error(path, fmt::format("is \"auto\", but nothing gives its value for {}; "
                                        "write the value",
                                        owner));
    }
    st.note_auto(path, value_text(value), std::string(kReferenceDefault));
  } else if (f.present) {
    value = f.value;
  }
  out->items.push_back(Param{std::string(s.name), ParamValue(value)});
  return Status::ok();
}

// A value the command line also sets: see take_from_context.
template <typename T>
Status resolve_sourced(ParseState& st, const ParamSpec& s, const std::string& path,
                       const Field<T>& f, const std::optional<T>& given, T def,
                       std::string_view owner, ParamList* out,
                       const std::optional<T>& trainer_default = std::nullopt) {
  if (s.source == ParamSource::kNone || s.source == ParamSource::kZero) {
    return resolve_plain(st, s, path, f, def, owner, out);
  }
  if (!f.present && !given) {
    if (s.presence == Presence::kRequired) {
      return st.error(path, fmt::format("required for {}; give it here or pass {}", owner,
                                        option_of(s.source)));
    }
    if (s.presence == Presence::kOptional) return Status::ok();
  }
  T value = def;
  ZINF_RETURN_IF_ERROR(take_from_context(st, path, f, given, option_of(s.source), &value, trainer_default));
  out->items.push_back(Param{std::string(s.name), ParamValue(value)});
  return Status::ok();
}

IntRange int_range(const NumberRange& r) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  return IntRange{static_cast<std::int64_t>(r.min),
                  r.max == kInf ? kMax : static_cast<std::int64_t>(r.max)};
}

Status read_one(ParseState& st, ObjectReader& r, const ParamSpec& s, std::string_view owner,
                ParamList* out) {
  const AutoContext& ctx = st.ctx();
  std::string path = r.key_path(s.name);
  switch (s.kind) {
    case ParamKind::kIgnored:
      r.ignore(std::span<const std::string_view>(&s.name, 1));
      return Status::ok();
    case ParamKind::kMustBeFalse: {
      ZINF_ASSIGN_OR_RETURN(auto f, r.boolean(s.name));
      if (f.has_value() && f.value) {
        return st.error(path, fmt::format("zinf does not implement {} for {}; remove it or set it "
                                          "to false",
                                          s.name, owner));
      }
      return Status::ok();
    }
    case ParamKind::kMustBeZero: {
      ZINF_ASSIGN_OR_RETURN(auto f, r.number(s.name, NumberRange{-kInf}));
      if (f.has_value() && f.value != 0.0) {
        return st.error(path, fmt::format("zinf does not implement {} for {}; remove it or set it "
                                          "to 0",
                                          s.name, owner));
      }
      return Status::ok();
    }
    case ParamKind::kBool: {
      ZINF_ASSIGN_OR_RETURN(auto f, r.boolean(s.name));
      return resolve_plain<bool>(st, s, path, f, s.def != 0.0, owner, out);
    }
    case ParamKind::kWarmupType: {
      ZINF_ASSIGN_OR_RETURN(auto f, r.choice(s.name, {"log", "linear"}));
      return resolve_plain<std::string>(st, s, path, f, std::string(s.def_text), owner, out);
    }
    case ParamKind::kNumber: {
      ZINF_ASSIGN_OR_RETURN(auto f, r.number(s.name, s.range));
      return resolve_sourced<double>(st, s, path, f, number_from(ctx, s.source), s.def, owner, out,
                                     trainer_number(s.source));
    }
    case ParamKind::kInt: {
      ZINF_ASSIGN_OR_RETURN(auto f, r.integer(s.name, int_range(s.range)));
      if (s.source == ParamSource::kTotalSteps && f.is_auto && !ctx.total_steps && ctx.run_steps) {
        // "auto" is the one case where the schedule's length follows the run's (--steps).
        st.note_auto(path, value_text(*ctx.run_steps), std::string(cli_option::kSteps));
        out->items.push_back(Param{std::string(s.name), ParamValue(*ctx.run_steps)});
        return Status::ok();
      }
      return resolve_sourced<std::int64_t>(st, s, path, f, int_from(ctx, s.source),
                                   static_cast<std::int64_t>(s.def), owner, out, trainer_int(s.source));
    }
    case ParamKind::kBetas: {
      ZINF_ASSIGN_OR_RETURN(auto f, r.numbers(s.name, 2, s.range));
      std::optional<std::vector<double>> given;
      if (s.source == ParamSource::kBetas && ctx.betas) {
        given = std::vector<double>{(*ctx.betas)[0], (*ctx.betas)[1]};
      }
      const std::optional<std::vector<double>> trainer =
          s.source == ParamSource::kBetas
              ? std::optional(std::vector<double>{TrainerDefaults::kBeta1, TrainerDefaults::kBeta2})
              : std::nullopt;
      return resolve_sourced<std::vector<double>>(st, s, path, f, given, {s.def, s.def2}, owner, out, trainer);
    }
  }
  return Status::ok();
}

}  // namespace

Status read_params(ParseState& st, ObjectReader& r, std::span<const ParamSpec> specs,
                   std::string_view owner, ParamList* out) {
  for (const ParamSpec& s : specs) ZINF_RETURN_IF_ERROR(read_one(st, r, s, owner, out));
  return Status::ok();
}

}  // namespace zinf::config::detail
