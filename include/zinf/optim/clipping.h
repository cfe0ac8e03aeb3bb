// Gradient clipping by global norm, combined with loss unscaling into one multiplier.
#pragma once

namespace zinf::optim {

struct ClipResult {
  double grad_scale = 1.0;  // multiply the stored gradients by this (GradView::scale)
  double norm = 0.0;        // the unscaled gradient norm: norm of the stored grads / loss_scale
  bool clipped = false;     // the norm exceeded max_norm
};

// The reference formula. scaled_norm is the norm of the gradients as stored (still multiplied
// by loss_scale; sqrt of GradStats::sq_norm summed over all of them). With max_norm > 0:
//   clip = (scaled_norm / loss_scale + 1e-6) / max_norm
//   grad_scale = 1 / (clip * loss_scale) if clip > 1, else 1 / loss_scale.
// max_norm <= 0 turns clipping off (grad_scale = 1 / loss_scale). A non-finite norm means
// overflow, which the caller must have handled (the step is skipped) before clipping.
ClipResult clip_gradients(double scaled_norm, double loss_scale, double max_norm);

}  // namespace zinf::optim
