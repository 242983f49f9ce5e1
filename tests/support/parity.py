"""What "the sharded path computes what one process computes" means for one worker update, and the tolerances that
say it in float32.

A layout (FSDP, HSDP, TP, SP, CP, other microbatch sizes) changes the order of float32 sums, nothing else, so each
quantity is compared relative to its own size:

- forward outputs (values, log-probs) and the losses' statistics: absolute ``FORWARD_TOL`` (values and log-probs
  are O(1) to O(10) here, so 1e-5 is ~1e-6 relative: a few float32 ulps after a dozen layers);
- gradients, per parameter, before the optimizer: ``max |g - g_ref| <= GRAD_RTOL * max |g_ref|``;
- the update, per parameter: ``||w - w_ref|| <= UPDATE_RTOL * ||w_ref - w_initial||``. Adam's first step is
  ``lr * g / (|g| + eps)``: an entry whose gradient is near ``eps`` turns a float32 difference in ``g`` into a
  sizeable share of ``lr`` (the cause of an AVX2-only failure of an absolute 1e-5 bound on LoRA weights, whose
  update is lr = 1e-2 per entry), so the update is judged as a whole, against its own size.

Where the numbers come from: ``python -m tests.support.parity`` prints the spread of every parity run against one
process; the constants below cite it on both kernel sets.
"""

from __future__ import annotations

import torch

# Measured (``main``) on a 2-core AMD EPYC, 2026-12-07, the largest over every layout below and LoRA at dp 2:
#                     AVX-512 kernels   AVX2 kernels
#   forward / stats   9.5e-07           9.5e-07      (absolute)
#   gradients         7.4e-07           8.1e-07      (relative to the tensor's largest entry)
#   update            7.6e-05           7.6e-05      (relative to the update's norm)
# Forward outputs and statistics: a few float32 ulps of O(1)-O(10) values after a dozen layers; 10x the spread.
FORWARD_TOL = 1e-5
# Float32 sums in another order: |fl(sum) - sum| <= (n - 1) * eps32 * sum |x|, eps32 = 1.19e-7. A gradient entry
# sums over the batch's ~240 response tokens (then over microbatches and ranks): (n - 1) * eps32 ~ 3e-5 relative
# to sum |x|, which exceeds the largest entry a few times where terms cancel: 1e-4 (the measured spread is ~1e-6).
GRAD_RTOL = 1e-4
# Gradients under this share of the model's largest entry are compared on that scale (relative_gradient_diff): OPT's
# key biases hold ~5e-11 of it, pure round-off; the smallest real ones here (query biases) ~4e-4.
GRAD_FLOOR = 1e-3
# No worst case exists for Adam's first step (an entry with |g| ~ eps may land anywhere in (-lr, lr)); the spread
# comes from a handful of such entries. 13x the measured spread; an update 1 % off fails (test_parity).
UPDATE_RTOL = 1e-3
# Steps under this share of the largest per-entry step are judged on that scale (relative_update_diff), as GRAD_FLOOR.
UPDATE_FLOOR = 1e-3


def relative_gradient_diff(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per parameter, ``max |got - ref|`` over the larger of ``max |ref|`` and ``GRAD_FLOOR`` times the largest
    entry of the whole gradient: a tensor whose gradient is 0 by symmetry (a key projection's bias: softmax ignores
    a shift shared by every key) holds round-off only, which is judged on the model's scale, not its own."""
    assert ref.keys() == got.keys() and ref, (sorted(ref), sorted(got))
    floor = GRAD_FLOOR * max(float(g.abs().max()) for g in ref.values())
    out = {}
    for name, g in ref.items():
        scale = max(float(g.abs().max()), floor)
        diff = float((got[name].float() - g.float()).abs().max())
        out[name] = diff / scale if scale > 0 else diff
    return out


def relative_update_diff(
    ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]
) -> dict[str, float]:
    """Per tensor that the update moved, ``||got - ref||`` over the larger of ``||ref - initial||`` and the norm a
    tensor of its size would have at ``UPDATE_FLOOR`` times the largest per-entry (RMS) step of any tensor: a tensor
    whose gradient is round-off (relative_gradient_diff) takes a step of round-off, judged on the model's scale."""
    assert ref.keys() == got.keys()
    steps = {name: (w.float() - initial[name].float()) for name, w in ref.items()}
    floor_rms = UPDATE_FLOOR * max(float(s.norm()) / s.numel() ** 0.5 for s in steps.values())
    out = {}
    for name, step in steps.items():
        scale = max(float(step.norm()), floor_rms * step.numel() ** 0.5)
        if scale > 0:
            out[name] = float((got[name].float() - ref[name].float()).norm()) / scale
    assert out, "the update moved no tensor"
    return out


def max_abs_diff(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    if a is None or b is None:
        assert a is None and b is None
        return 0.0
    return float((a.float() - b.float()).abs().max())


def spread(ref: dict, got: dict, roles=("policy", "value")) -> dict[str, float]:
    """The largest difference of each kind between two worker runs (``tests.support.harness.worker_results``)."""
    out = {}
    for role in roles:
        forward = "logprobs" if role == "policy" else "values"
        out[f"{role}/forward"] = max_abs_diff(ref[forward], got[forward])
        metrics = ref[f"{role}_metrics"]
        out[f"{role}/metrics"] = max(abs(float(metrics[k]) - float(got[f"{role}_metrics"][k])) for k in metrics)
        out[f"{role}/grad_rel"] = max(relative_gradient_diff(ref[f"{role}_grads"], got[f"{role}_grads"]).values())
        weights, initial = ref[f"{role}_weights"], ref[f"{role}_initial"]
        out[f"{role}/update_rel"] = max(relative_update_diff(weights, got[f"{role}_weights"], initial).values())
    return out


def assert_same_step(ref: dict, got: dict) -> None:
    """One optimizer step agrees: ``grads`` (by parameter name) to ``GRAD_RTOL`` and the update (``weights`` after
    it, ``initial`` before it, from ``ref``) to ``UPDATE_RTOL``."""
    grads = relative_gradient_diff(ref["grads"], got["grads"])
    assert max(grads.values()) <= GRAD_RTOL, max(grads.items(), key=lambda kv: kv[1])
    updates = relative_update_diff(ref["weights"], got["weights"], ref["initial"])
    assert max(updates.values()) <= UPDATE_RTOL, max(updates.items(), key=lambda kv: kv[1])


def assert_same_update(
    ref: dict, got: dict, check_policy: bool = True, check_value: bool = True, check_replica: bool = True
) -> None:
    """``got`` (a sharded run, ``tests.support.harness.worker_results``) computed what ``ref`` (one process) did:
    forward outputs, the losses' statistics, every parameter's gradient and the update, each to its tolerance;
    with ``check_replica``, the policy's generation replica holds the trained weights (LoRA's holds them merged)."""
    roles = [r for r, on in (("policy", check_policy), ("value", check_value)) if on]
    for role in roles:
        forward = "logprobs" if role == "policy" else "values"
        assert max_abs_diff(ref[forward], got[forward]) < FORWARD_TOL, forward
        for key, value in ref[f"{role}_metrics"].items():
            assert abs(float(value) - float(got[f"{role}_metrics"][key])) < FORWARD_TOL, (role, key)
        step = {"grads": f"{role}_grads", "weights": f"{role}_weights", "initial": f"{role}_initial"}
        assert_same_step({k: ref[v] for k, v in step.items()}, {k: got[v] for k, v in step.items()})
    if check_policy and check_replica:
        assert max_abs_diff_dict(got["policy_weights"], got["rollout_weights"]) == 0.0  # the replica was refit


def max_abs_diff_dict(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest entry difference over the tensors of ``a`` (each also in ``b``)."""
    return max(max_abs_diff(a[k], b[k]) for k in a)


# The layouts the parity tests run, by name: (ranks, overrides beside MICRO, roles compared).
MICRO = ["policy.train_micro_batch_size=2", "value.train_micro_batch_size=2"]
_BOTH, _VALUE, _POLICY = ("policy", "value"), ("value",), ("policy",)
_NO_PACKING = [f"{w}.{k}=false" for w in _BOTH for k in ("parallel.unsharded_grad_accumulation", "sequence_packing")]
_CP2 = ["policy.parallel.cp=2", "value.parallel.cp=2"]
LAYOUTS = {
    "fsdp dp2": (2, [], _BOTH),
    "fsdp dp2 per-microbatch, padded": (2, _NO_PACKING, _BOTH),
    "hsdp 2 replicas": (2, [f"{w}.parallel.dp_replicate=2" for w in _BOTH], _BOTH),
    "critic tp2": (2, ["value.parallel.tp=2"], _VALUE),
    "critic dp2 x tp2": (4, ["value.parallel.tp=2"], _VALUE),
    "critic tp2 sp": (2, ["value.parallel.tp=2", "value.parallel.sequence_parallel=true"], _VALUE),
    "policy tp2 sp": (2, ["policy.parallel.tp=2", "policy.parallel.sequence_parallel=true"], _POLICY),
    "micro 1": (1, ["policy.train_micro_batch_size=1", "value.train_micro_batch_size=1"], _BOTH),
    "micro 8": (1, ["policy.train_micro_batch_size=8", "value.train_micro_batch_size=8"], _BOTH),
    "cp2": (2, _CP2, _BOTH),
    "cp4": (4, ["policy.parallel.cp=4", "value.parallel.cp=4"], _BOTH),
    "dp2 x cp2, critic tp2 x cp2": (4, [*_CP2, "value.parallel.tp=2"], _BOTH),
}


def main() -> None:
    """Print each layout's spread against one process (the measurement behind the tolerances above)."""
    from tests.distributed.test_lora_ranks import LORA
    from tests.support.harness import run, worker_round

    pairs = [(MICRO, name, layout) for name, layout in LAYOUTS.items()] + [(LORA, "lora dp2", (2, [], _BOTH))]
    references = {}
    for base, name, (ranks, extra, roles) in pairs:
        reference = references.setdefault(id(base), run(worker_round, 1, base))
        figures = spread(reference, run(worker_round, ranks, base + extra), roles)
        print(f"{name}: " + ", ".join(f"{k} {v:.2e}" for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    main()
