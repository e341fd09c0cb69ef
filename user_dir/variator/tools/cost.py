"""Cost with and without Variator plugins, side by side in one run: analytic FLOPs
(user_dir/common/flops.py), FLOPs counted by PyTorch's FlopCounterMode on the same batch, and timed
forwards.

    python -m user_dir.variator.tools.cost DATA --path backbone.pt --plugins k2.pt,k4.pt \\
        --length 128 --batch-size 16 --runs 9 --json cost.json [--generate 200 --beam 5]

Two timings, never to be confused:

* **encoder alone on fixed-length blocks**: the ``--subset`` sentences of DATA (the source side for
  translation, input0 for sentence prediction) concatenated and cut into ``--batch-size`` sequences
  of exactly ``--length`` tokens (no padding), one encoder forward each;
* **end-to-end translation** (``--generate N``, translation backbones only): beam search
  (``--beam``) over the first N sentences of ``--gen-subset`` at their real lengths, batches of
  ``--gen-batch-size``, encoder and decoder; its FLOPs are counted by PyTorch's counter over the same
  pass (the decoder's work depends on what each setting generates, so it is counted, not derived).

Speed-up: in each of ``--runs`` runs, every plugin is timed against the backbone *alternately*
(B P B P ..., ``--repeats`` times each, the order flipped every other run), so both see the same
moment of a shared machine; the run's ratio is median(backbone) / median(plugin). The point estimate
is the median of the runs' ratios and its spread their min-max. A speed-up above its FLOP bound (the
backbone's total FLOPs over the plugged model's) cannot come from the plugin's arithmetic: such a
point estimate is flagged as noise (``above_flop_bound``), not reported as speed.
"""
import argparse
import json
import os
import statistics
import sys
import time
from typing import List, Sequence

import torch


# ---- the summary: pure functions (tested on hand-made numbers) --------------------------------------
def summarise_speedup(backbone_runs: Sequence[Sequence[float]], plugin_runs: Sequence[Sequence[float]],
                      flop_bound: float) -> dict:
    """Speed-up of a plugin over the backbone from paired runs.

    ``backbone_runs[i]`` and ``plugin_runs[i]`` are the forward times (seconds) of run i, taken
    alternately. Returns the median of the per-run ratios median(backbone)/median(plugin) as the
    point estimate, their min and max as the spread, the FLOP bound and whether the point estimate
    exceeds it (measurement noise: the plugin cannot be faster than its arithmetic allows).
    """
    if not backbone_runs or len(backbone_runs) != len(plugin_runs):
        raise ValueError(f"paired runs needed: {len(backbone_runs)} backbone runs, {len(plugin_runs)} plugin runs")
    if flop_bound <= 0:
        raise ValueError(f"flop_bound {flop_bound}: a ratio of FLOPs must be positive")
    ratios = []
    for b, p in zip(backbone_runs, plugin_runs):
        if not b or not p or min(b) <= 0 or min(p) <= 0:
            raise ValueError("every run needs positive times for both the backbone and the plugin")
        ratios.append(statistics.median(b) / statistics.median(p))
    point = statistics.median(ratios)
    return {"median": point, "min": min(ratios), "max": max(ratios), "ratios": ratios, "runs": len(ratios),
            "flop_bound": flop_bound, "above_flop_bound": point > flop_bound}


def format_speedup(s: dict) -> str:
    """'1.38x [1.21-1.55]', with ' (> FLOP bound 1.42x: noise)' appended when the point estimate exceeds it."""
    text = f"{s['median']:.2f}x [{s['min']:.2f}-{s['max']:.2f}]"
    return text + (f" (> FLOP bound {s['flop_bound']:.2f}x: noise)" if s["above_flop_bound"] else "")


def alternate(settings: List[int], runs: int, repeats: int, time_one) -> dict:
    """Time every plugin against the backbone alternately: ``{k: {"backbone": [[s, ...] per run],
    "plugin": [[s, ...] per run]}}``. ``time_one(k)`` returns one forward's seconds (k = 0: backbone)."""
    timings = {k: {"backbone": [], "plugin": []} for k in settings if k}
    for run in range(runs):
        for k in timings:
            pair = {0: [], k: []}
            order = (k, 0) if run % 2 else (0, k)  # who goes first flips every run
            for _ in range(repeats):
                for which in order:
                    pair[which].append(time_one(which))
            timings[k]["backbone"].append(pair[0])
            timings[k]["plugin"].append(pair[k])
    return timings


# ---- inputs --------------------------------------------------------------------------------------
def real_batch(task, data_subset: str, length: int, batch_size: int) -> torch.Tensor:
    from fairseq.data import data_utils
    data = task.cfg.data.split(os.pathsep)[0]
    if hasattr(task.cfg, "source_lang") and task.cfg.source_lang:
        src, tgt = task.cfg.source_lang, task.cfg.target_lang
        path, dictionary = os.path.join(data, f"{data_subset}.{src}-{tgt}.{src}"), task.source_dictionary
    else:
        path, dictionary = os.path.join(data, "input0", data_subset), task.source_dictionary
    dataset = data_utils.load_indexed_dataset(path, dictionary)
    if dataset is None:
        sys.exit(f"encoder_cost: no binarised data at {path}")
    stream, need = [], length * batch_size
    for i in range(len(dataset)):
        tokens = dataset[i]
        stream.append(tokens[tokens.ne(dictionary.eos()) & tokens.ne(dictionary.bos())])
        if sum(t.numel() for t in stream) >= need:
            break
    flat = torch.cat(stream)
    if flat.numel() < need:
        flat = flat.repeat(need // max(flat.numel(), 1) + 1)
    return flat[:need].view(batch_size, length)


def encoder_forward(model, tokens):
    from user_dir.variator.plugged_encoder import transformer_encoder
    encoder = transformer_encoder(model)
    return lambda: encoder(tokens, src_lengths=torch.full((tokens.size(0),), tokens.size(1)))


def translation_pass(task, model, subset: str, sentences: int, batch_size: int, beam: int):
    """A function running beam search over the first ``sentences`` sentences of ``subset`` (fairseq's
    length-sorted batches of ``batch_size``) and returning the number of generated tokens."""
    from fairseq.dataclass.configs import GenerationConfig
    if not hasattr(task, "source_dictionary") or not getattr(task.cfg, "source_lang", None):
        sys.exit("encoder_cost: --generate times end-to-end translation; this backbone's task is not translation")
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    chosen = [i for i in dataset.ordered_indices().tolist() if i < sentences]
    batches = [dataset.collater([dataset[i] for i in chosen[s:s + batch_size]])
               for s in range(0, len(chosen), batch_size)]
    generator = task.build_generator([model], GenerationConfig(beam=beam))

    def run():
        tokens = 0
        for sample in batches:
            for hyps in task.inference_step(generator, [model], sample):
                tokens += hyps[0]["tokens"].numel()
        return tokens
    return run, len(chosen)


# ---- the measurement -----------------------------------------------------------------------------
def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(path: str, data: str, plugins: str, subset: str, length: int, batch_size: int, runs: int,
            repeats: int, threads: int, generate: int = 0, gen_subset: str = "test", gen_batch_size: int = 64,
            beam: int = 5, gen_repeats: int = 1, gen_runs: int = 0) -> dict:
    import user_dir  # noqa: F401
    from fairseq import checkpoint_utils
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from user_dir.common.flops import encoder_flops
    from user_dir.tools.measure import machine_description
    from user_dir.variator.plugged_encoder import attach_plugin_files

    if threads:
        torch.set_num_threads(threads)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data})
    model = models[0].eval()
    container = attach_plugin_files(model, plugins)
    sig = container.signature
    tokens = real_batch(task, subset, length, batch_size)
    forward = encoder_forward(model, tokens)
    settings = [0] + container.ratios
    rows = {}

    def counted(fn):
        counter = FlopCounterMode(display=False)
        # the math attention kernel: the counter has no formula for the fused CPU kernel
        with counter, sdpa_kernel(SDPBackend.MATH):
            out = fn()
        return counter.get_total_flops(), out

    def switched(fn):
        def time_one(k):
            container.use(k)
            return timed(fn)
        return time_one

    with torch.inference_mode():
        for k in settings:
            container.use(k)
            config = container.plugins[container.key(k)].config if k else None
            analytic = encoder_flops(batch_size, length, sig["layers"], sig["embed_dim"], sig["ffn_dim"],
                                     config.as_dict() if config else None,
                                     set(config.layers) if config else None)
            params = sum(p.numel() for p in container.plugins[container.key(k)].parameters()) if k else 0
            rows[k] = {"ratio": k, "analytic_flops": analytic, "profiler_flops": counted(forward)[0],
                       "plugin_params": params}
        for _ in range(2):  # warm-up
            for k in settings:
                container.use(k)
                forward()
        encoder_timings = alternate(settings, runs, repeats, switched(forward))
        end_to_end = None
        if generate:
            passes, n = translation_pass(task, model, gen_subset, generate, gen_batch_size, beam)
            gen_runs = gen_runs or runs
            end_to_end = {"sentences": n, "subset": gen_subset, "beam": beam, "batch_size": gen_batch_size,
                          "runs": gen_runs, "repeats": gen_repeats, "rows": {}}
            for k in settings:
                container.use(k)
                flops, generated = counted(passes)
                end_to_end["rows"][k] = {"ratio": k, "profiler_flops": flops, "generated_tokens": generated}
            gen_timings = alternate(settings, gen_runs, gen_repeats, switched(passes))
    backbone_params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("variator."))
    for k, row in rows.items():
        a0, a = rows[0]["analytic_flops"], row["analytic_flops"]
        row["plugin_params_percent"] = 100.0 * row["plugin_params"] / backbone_params
        row["encoder_flops_saved_percent"] = 100.0 * (1 - a["total"] / a0["total"])
        row["ffn_flops_saved_percent"] = 100.0 * (1 - (a["ffn"] + a["plugin"]) / a0["ffn"])
        if k:
            row["timings"] = encoder_timings[k]
            row["speedup"] = summarise_speedup(encoder_timings[k]["backbone"], encoder_timings[k]["plugin"],
                                               a0["total"] / a["total"])
            if end_to_end:
                e = end_to_end["rows"][k]
                e["timings"] = gen_timings[k]
                e["speedup"] = summarise_speedup(gen_timings[k]["backbone"], gen_timings[k]["plugin"],
                                                 end_to_end["rows"][0]["profiler_flops"] / e["profiler_flops"])
    return {"path": path, "data": data, "plugins": plugins, "length": length, "batch_size": batch_size,
            "runs": runs, "repeats": repeats, "threads": torch.get_num_threads(), "backbone": sig,
            "backbone_params": backbone_params, "machine": machine_description(), "rows": list(rows.values()),
            "end_to_end": dict(end_to_end, rows=list(end_to_end["rows"].values())) if end_to_end else None}


def format_rows(result: dict) -> str:
    lines = [f"Encoder alone on fixed-length blocks ({result['batch_size']} x {result['length']} tokens), speed-up = "
             f"median [min-max] over {result['runs']} runs of paired ratios:", "",
             "| k | plugin params (% of backbone) | encoder GFLOPs (analytic / profiler) | FFN FLOPs saved "
             "| encoder FLOPs saved | encoder speed-up |", "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['ratio'] or 'none'} | {r['plugin_params']:,} ({r['plugin_params_percent']:.2f}%) | "
                     f"{r['analytic_flops']['total'] / 1e9:.3f} / {r['profiler_flops'] / 1e9:.3f} | "
                     f"{r['ffn_flops_saved_percent']:.1f}% | {r['encoder_flops_saved_percent']:.1f}% | "
                     f"{format_speedup(r['speedup']) if r['ratio'] else '1.00x'} |")
    e = result.get("end_to_end")
    if e:
        lines += ["", f"End-to-end translation (beam {e['beam']}, {e['sentences']} {e['subset']} sentences, batches of "
                  f"{e['batch_size']}):", "", "| k | GFLOPs (profiler) | generated tokens | translation speed-up |",
                  "|---|---|---|---|"]
        for r in e["rows"]:
            lines.append(f"| {r['ratio'] or 'none'} | {r['profiler_flops'] / 1e9:.3f} | {r['generated_tokens']:,} | "
                         f"{format_speedup(r['speedup']) if r['ratio'] else '1.00x'} |")
    return "\n".join(lines)


def cli_main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="the backbone's binarised data directory (dictionaries and --subset)")
    parser.add_argument("--path", required=True, help="the backbone checkpoint")
    parser.add_argument("--plugins", default="", help="comma-separated plugin files to compare with the backbone")
    parser.add_argument("--subset", default="valid", help="where the real tokens of the fixed-length blocks come from")
    parser.add_argument("--length", type=int, default=128, help="tokens per fixed-length block (default 128)")
    parser.add_argument("--batch-size", type=int, default=16, help="fixed-length blocks per encoder forward")
    parser.add_argument("--runs", type=int, default=9, help="timed runs; each times every plugin against the "
                        "backbone alternately")
    parser.add_argument("--repeats", type=int, default=3, help="encoder forwards of each of the pair per run")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own)")
    parser.add_argument("--generate", type=int, default=0, help="also time end-to-end translation of the first N "
                        "sentences of --gen-subset (0: no)")
    parser.add_argument("--gen-subset", default="test")
    parser.add_argument("--gen-batch-size", type=int, default=64)
    parser.add_argument("--gen-repeats", type=int, default=1, help="translation passes of each of the pair per run")
    parser.add_argument("--gen-runs", type=int, default=0, help="timed runs of translation (default: --runs)")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--json", help="write the full result here")
    args = parser.parse_args(argv)
    for flag in ("length", "batch_size", "runs", "repeats", "gen_batch_size", "gen_repeats", "beam"):  # --gen-runs 0: --runs
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    result = measure(args.path, args.data, args.plugins, args.subset, args.length, args.batch_size, args.runs,
                     args.repeats, args.threads, args.generate, args.gen_subset, args.gen_batch_size, args.beam,
                     args.gen_repeats, args.gen_runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(format_rows(result))
    print(f"\n{result['threads']} threads; {result['machine']}")


if __name__ == "__main__":
    cli_main()
