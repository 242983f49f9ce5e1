"""The device check's lines, one phase at a time as it ends (bench/device/check.py): a command cut at its limit
still shows what each finished phase measured."""

from __future__ import annotations


def print_phase(name: str, outcome: dict) -> None:
    if "error" in outcome:
        print(f"{name}: ERROR after {outcome['seconds']:.1f} s: {outcome['error']}\n{outcome['traceback']}", flush=True)
        return
    if "skipped" in outcome:
        print(f"{name}: skipped ({outcome['skipped']})", flush=True)
        return
    lines = PRINTERS.get(name, _generic)(outcome)
    verdict = "ok" if outcome.get("passed", True) else "FAILED"
    print("\n".join([f"{name} ({outcome['seconds']:.1f} s): {verdict}", *lines]), flush=True)
    if outcome.get("stderr_tail"):
        print(outcome["stderr_tail"], flush=True)


def _generic(outcome: dict) -> list[str]:
    return [
        f"  {k}: {v}" for k, v in outcome.items() if not isinstance(v, (dict, list)) and k not in ("seconds", "passed")
    ]


def _numerics(outcome: dict) -> list[str]:
    lines = [f"  {'check':<64}{'lp max':>9}{'lp mean':>9}{'v max':>9}{'loss':>10}{'gn rel':>9}  ok"]
    for c in outcome["checks"]:
        loss = max(c["policy_loss_diff"], c["critic_loss_diff"])
        grad = max(c["policy_grad_norm_rel_diff"], c["critic_grad_norm_rel_diff"])
        lines.append(
            f"  {c['check']:<64}{c['logprob_max_abs_diff']:>9.1e}{c['logprob_mean_abs_diff']:>9.1e}"
            f"{c['value_max_abs_diff']:>9.1e}{loss:>10.1e}{grad:>9.1e}  {'yes' if c['passed'] else 'NO'}"
        )
    return lines


def _step(s: dict) -> list[str]:
    head = (
        f"  PPOLoop.step ({s['model_shape']['hidden_size']}h x {s['model_shape']['num_layers']}L, V = "
        f"{s['vocab_size']}, {s['precision']}, {s['batch']} prompts x <={s['max_new_tokens']} new tokens)"
    )
    if "timing_s_median" not in s:
        return [f"{head}: exit {s['exit_code']}, no measured step"]
    t = s["timing_s_median"]
    memory = s["max_memory_allocated_gib"]
    lines = [
        f"{head}: {t['timing/step']:.3f} s/step, {s['tokens_per_s']:.0f} tok/s, generation "
        f"{s['generated_tokens_per_s']:.0f} tok/s, ~{s['achieved_tflops']:.3g} TFLOP/s = "
        f"{100 * s['peak_fraction']:.1f}% of the measured {s['peak_matmul_dtype']} matmul peak "
        f"({s['peak_tflops']:.3g} TFLOP/s), max memory {'n/a' if memory is None else f'{memory:.1f} GiB'}",
        "  timing/* medians (s): " + ", ".join(f"{k.removeprefix('timing/')} {v:.3f}" for k, v in t.items()),
        "  update of peak: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in s["update_peak_fraction"].items()),
    ]
    if s.get("update_peak_fraction_goal") is not None:
        lines.append(f"  goal (each update's fraction of peak): >= {s['update_peak_fraction_goal']}")
    lines.append("  last step: " + ", ".join(f"{k} {v}" for k, v in s.get("last_step", {}).items()))
    for name, p in s.get("update_profiles", {}).items():
        lines.append(
            f"  {name} update profiled, top operators by {p['ranked_by']}: "
            + "; ".join(f"{op['name']} {op[p['ranked_by']]:.1f} ms x{op['calls']}" for op in p["top"][:6])
        )
    if s.get("critic_over_policy_self_time") is not None:
        lines.append(f"  critic/policy update self time {s['critic_over_policy_self_time']:.2f}")
    return lines


def _decode(d: dict) -> list[str]:
    lines = [
        f"  {d['prompts']} x {d['new_tokens']}: {name:<40}{v['tokens_per_s']:>10.0f} tok/s (first call "
        f"{v['first_call_s']:.1f} s)"
        for name, v in d["variants"].items()
    ]
    lines += [f"  {name}: {line}" for name, line in d.get("decoders", {}).items()]
    if "cuda_graphs_captured" in d:
        lines.append(f"  CUDA graphs captured: {d['cuda_graphs_captured']} (inductor {d['inductor_counters']})")
    for goal, value in d.get("goals", {}).items():
        if not goal.endswith("_goal"):
            lines.append(f"  {goal} {value:.2f}x (goal >= {d['goals'][goal + '_goal']}x)")
    return lines


def _checkpoint(c: dict) -> list[str]:
    return [f"  2 steps + resume to 3: exit {c['exit_codes']}, steps {c['steps_logged']}, resumed {c['resumed']}"]


def _memory_features(m: dict) -> list[str]:
    return [
        f"  {r['role']:<7}{r['feature']:<26}device MiB: resident {r['device_resident_MiB']:>7.0f}, held after "
        f"forward {r['device_held_after_forward_MiB']:>7.0f}, fwd+bwd peak +{r['device_fwd_bwd_peak_added_MiB']:.0f}, "
        f"optimizer peak +{r['device_optimizer_peak_added_MiB']:.0f}; {r['fwd_bwd_s']:.2f} + {r['optimizer_s']:.2f} s"
        for r in m["rows"]
    ]


def _memory_lora(m: dict) -> list[str]:
    return [
        f"  {r['mode']:<10} device MiB: resident {r['device_resident_MiB']:>7.0f}, warm-up peak "
        f"{r['device_peak_MiB']:>7.0f}; AdamW state {r['optimizer_state_MiB']:.0f}"
        for r in m["rows"]
    ]


def _quickstart(q: dict) -> list[str]:
    memory = q["max_memory_allocated_gib"]
    return [
        f"  {q['recipe']} ({q['shape']} shape, 2 steps): exit {q['exit_codes']}, peak "
        f"{'n/a' if memory is None else f'{memory:.1f} GiB'}, checkpoints {q['checkpoints']}, exported {q['exported']}"
    ]


def _long_responses(result: dict) -> list[str]:
    lines = []
    for row in result["rows"]:
        cells = f"{row['seconds']:.2f} s, peak {row['peak_mib']:.0f} MiB" if "seconds" in row else row["failed"]
        lines.append(f"  {row['what']} at T={row['T']} ({row['layout']}, cp {row['cp']}): {cells}")
    return lines


PRINTERS = {"numerics": _numerics, "decode": _decode, "hf_generate": _decode, "checkpoint_resume": _checkpoint}
PRINTERS |= {name: _step for name in ("step", "table_0.5b", "table_1.5b", "step_vllm")}
PRINTERS |= {"memory_features": _memory_features, "memory_lora": _memory_lora, "quickstart": _quickstart}
PRINTERS |= {"long_responses": _long_responses}
