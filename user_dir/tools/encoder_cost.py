"""Encoder cost with and without Variator plugins, side by side in one run: analytic FLOPs
(user_dir/common/flops.py), FLOPs counted by PyTorch's FlopCounterMode on the same batch, and the
timed forward pass of the encoder.

    python -m user_dir.tools.encoder_cost DATA --path backbone.pt --plugins k2.pt,k4.pt \\
        --length 128 --batch-size 16 --runs 7 --json cost.json

The batch is real text: the ``--subset`` sentences of DATA (the source side for translation,
input0 for sentence prediction) concatenated and cut into ``--batch-size`` sequences of exactly
``--length`` tokens, so no position is padding. Each run times every setting in turn (the backbone
alone, then each plugin), ``--repeats`` forwards each, each forward timed on its own. The speed-up is
the ratio of the *fastest* forwards (best of runs x repeats), as Python's ``timeit`` recommends: on a
shared machine the slower timings come from other processes taking the CPU, not from the code, and
the minimum is the estimate they disturb least. The median is reported beside it.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch


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


def measure(path: str, data: str, plugins: str, subset: str, length: int, batch_size: int, runs: int,
            repeats: int, threads: int) -> dict:
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
    with torch.inference_mode():
        for k in settings:
            container.use(k)
            config = container.plugins[container.key(k)].config if k else None
            analytic = encoder_flops(batch_size, length, sig["layers"], sig["embed_dim"], sig["ffn_dim"],
                                     config.as_dict() if config else None,
                                     set(config.layers) if config else None)
            counter = FlopCounterMode(display=False)
            # the math attention kernel: the counter has no formula for the fused CPU kernel
            with counter, sdpa_kernel(SDPBackend.MATH):
                forward()
            params = sum(p.numel() for p in container.plugins[container.key(k)].parameters()) if k else 0
            rows[k] = {"ratio": k, "analytic_flops": analytic, "profiler_flops": counter.get_total_flops(),
                       "plugin_params": params, "seconds": []}
        for _ in range(2):  # warm-up
            for k in settings:
                container.use(k)
                forward()
        for _ in range(runs):
            for k in settings:
                container.use(k)
                for _ in range(repeats):
                    start = time.perf_counter()
                    forward()
                    rows[k]["seconds"].append(time.perf_counter() - start)
    backbone_params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("variator."))
    for row in rows.values():
        row["best_seconds"], row["median_seconds"] = min(row["seconds"]), statistics.median(row["seconds"])
        row["speedup"] = rows[0]["best_seconds"] / row["best_seconds"]
        row["median_speedup"] = rows[0]["median_seconds"] / row["median_seconds"]
        row["plugin_params_percent"] = 100.0 * row["plugin_params"] / backbone_params
        a0, a = rows[0]["analytic_flops"], row["analytic_flops"]
        row["encoder_flops_saved_percent"] = 100.0 * (1 - a["total"] / a0["total"])
        row["ffn_flops_saved_percent"] = 100.0 * (1 - (a["ffn"] + a["plugin"]) / a0["ffn"])
    return {"path": path, "data": data, "plugins": plugins, "length": length, "batch_size": batch_size,
            "runs": runs, "repeats": repeats, "threads": torch.get_num_threads(), "backbone": sig,
            "backbone_params": backbone_params, "machine": machine_description(), "rows": list(rows.values())}


def format_rows(result: dict) -> str:
    lines = ["| k | plugin params (% of backbone) | encoder GFLOPs (analytic / profiler) | FFN FLOPs saved "
             "| encoder FLOPs saved | forward ms (best / median) | speed-up (best / median) |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['ratio'] or 'none'} | {r['plugin_params']:,} ({r['plugin_params_percent']:.2f}%) | "
                     f"{r['analytic_flops']['total'] / 1e9:.3f} / {r['profiler_flops'] / 1e9:.3f} | "
                     f"{r['ffn_flops_saved_percent']:.1f}% | {r['encoder_flops_saved_percent']:.1f}% | "
                     f"{1000 * r['best_seconds']:.1f} / {1000 * r['median_seconds']:.1f} | "
                     f"{r['speedup']:.2f}x / {r['median_speedup']:.2f}x |")
    return "\n".join(lines)


def cli_main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="the backbone's binarised data directory (dictionaries and --subset)")
    parser.add_argument("--path", required=True, help="the backbone checkpoint")
    parser.add_argument("--plugins", default="", help="comma-separated plugin files to compare with the backbone")
    parser.add_argument("--subset", default="valid", help="where the real tokens of the batch come from")
    parser.add_argument("--length", type=int, default=128, help="tokens per sequence (default 128)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--runs", type=int, default=7, help="timed runs, every setting in turn in each")
    parser.add_argument("--repeats", type=int, default=3, help="forwards per setting in one run, each timed")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own)")
    parser.add_argument("--json", help="write the full result here")
    args = parser.parse_args(argv)
    result = measure(args.path, args.data, args.plugins, args.subset, args.length, args.batch_size, args.runs,
                     args.repeats, args.threads)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(format_rows(result))
    print(f"\nlength {args.length}, batch {args.batch_size}, {result['threads']} threads; {result['machine']}")


if __name__ == "__main__":
    cli_main()
