"""`m3bench sweep`: a serving Pareto sweep over TP x concurrency x (ISL, OSL), with a CI gate.

    m3bench sweep --model ckpt --load-format dummy --concurrency 1..64 --isl 1024 --osl 256 --out out/
    m3bench sweep --base-url http://127.0.0.1:8000 --tokenizer ckpt --tp 4 --concurrency 4,16,40 --out out/
    m3bench sweep --model ckpt --out out2/ --baseline out/ --max-regression 5 --repeats 3 --junit sweep.xml

Figures (vLLM `bench serve` definitions): TTFT, TPOT = (E2EL - TTFT) / (output tokens - 1),
ITL = gaps between streamed chunks (!= TPOT with speculative decoding), E2EL; interactivity
x90 = 1000 / P90 TPOT_ms (tok/s/user); throughput per GPU = total (prompt + output) tok/s / TP.
Writes out/points/*.json as each point finishes (a rerun resumes), then out/results.{json,csv}
and out/pareto.png. Exit 1 when a gated figure regressed (or a point failed), 2 on bad input.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Optional

import typer

from m3bench.cli.engine_flags import ASYNC_HELP, CUDA_GRAPHS_HELP
from m3bench.cli.errors import EXIT_REGRESSION, M3BenchError, user_errors


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)


def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    """'1,4,16' -> (1, 4, 16); '1..64' -> (1, 2, 4, ..., 64), doubling (the last bound included)."""
    try:
        if ".." in text:
            lo, hi = (int(x) for x in text.split(".."))
            if lo < 1 or hi < lo:
                raise ValueError
            out = [lo]
            while out[-1] * 2 <= hi:
                out.append(out[-1] * 2)
            return tuple(out) if out[-1] == hi else (*out, hi)
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise M3BenchError(f"--{what}: expected a list like 1,4,16 or a doubling range like 1..64, got {text!r}") from None
    if not values or min(values) < 1:
        raise M3BenchError(f"--{what}: values must be >= 1, got {text!r}")
    return values


def length_pairs(isl: str, osl: str) -> tuple[tuple[int, int], ...]:
    """Zip --isl and --osl; a single value on one side pairs with every value on the other."""
    ins, outs = parse_int_list(isl, "isl"), parse_int_list(osl, "osl")
    if len(ins) == 1:
        ins = ins * len(outs)
    if len(outs) == 1:
        outs = outs * len(ins)
    if len(ins) != len(outs):
        raise M3BenchError(f"--isl and --osl pair up: {len(ins)} vs {len(outs)} values")
    return tuple(zip(ins, outs))


def _dataset(value: str):
    from m3bench.bench.workload import DatasetKind

    if value in (DatasetKind.RANDOM.value, DatasetKind.GSM8K.value):
        return DatasetKind(value), None
    path = Path(value)
    if not path.is_file():
        raise M3BenchError(f"--dataset: expected random, gsm8k or a jsonl file, got {value!r}")
    return DatasetKind.JSONL, path


@user_errors
def sweep(
    model: Optional[Path] = typer.Option(None, "--model", help="Checkpoint directory (the bundled engine)."),
    load_format: str = typer.Option("auto", "--load-format", help="auto or dummy (random weights)."),
    tp: str = typer.Option("1", "--tp", help="Tensor-parallel sizes, e.g. 1,2,4."),
    concurrency: str = typer.Option("1,4,16,40,64", "--concurrency", help="List (1,4,16) or doubling range (1..64)."),
    isl: str = typer.Option("1024", "--isl", help="Input lengths in tokens (paired with --osl; random dataset only)."),
    osl: str = typer.Option("256", "--osl", help="Output lengths in tokens (ignore_eos)."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", min=1, help="Measured requests (10 x C)."),
    warmup: Optional[int] = typer.Option(None, "--warmup", min=0, help="Uncounted warm-up requests (2 x C)."),
    range_kind: str = typer.Option("inferencex", "--range-kind",
                                   help="inferencex: lengths in [r L, L]; vllm: [L(1-r), L(1+r)]."),
    range_ratio: Optional[float] = typer.Option(None, "--range-ratio", help="r (0.8 inferencex, 0 vllm)."),
    dataset: str = typer.Option("random", "--dataset", help="random, gsm8k, or a jsonl file (prompt/text/question)."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="An OpenAI-compatible server to measure."),
    serve_http: bool = typer.Option(False, "--serve", help="Start `m3bench serve` and measure over HTTP."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="M3BENCH_API_KEY"),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="Model id at --base-url."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="Tokenizer directory (default --model)."),
    out: Path = typer.Option(..., "--out", help="Output directory (resumes what is already there)."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="A previous sweep's results.json or --out dir."),
    max_regression: Optional[float] = typer.Option(None, "--max-regression", help="Gate: allowed fall in percent."),
    repeats: int = typer.Option(1, "--repeats", min=1, help="Runs per point (their spread widens the gate)."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Write a JUnit XML of the points."),
    synthetic_acceptance: Optional[float] = typer.Option(None, "--synthetic-acceptance",
                                                         help="Force this acceptance length (needs --draft)."),
    draft: Optional[Path] = typer.Option(None, "--draft", help="Eagle3 draft directory: speculative decoding "
                                         "(with --load-format dummy only its config.json is read)."),
    draft_len: int = typer.Option(3, "--draft-len", min=1, help="Draft tokens proposed per verify step."),
    draft_kv: str = typer.Option("separate", "--draft-kv", help="Draft KV pages: separate or shared."),
    cuda_graphs: bool = typer.Option(False, "--cuda-graphs", help=CUDA_GRAPHS_HELP),
    async_scheduling: Optional[bool] = typer.Option(None, "--async-scheduling/--no-async-scheduling", help=ASYNC_HELP),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help="auto (the model dtype), bf16, fp8, nvfp4, hybrid."),
    device: str = typer.Option("cpu", "--device"),
    dtype: str = typer.Option("auto", "--dtype"),
    num_kv_blocks: Optional[int] = typer.Option(None, "--num-kv-blocks", min=1),
    max_batch_size: int = typer.Option(64, "--max-batch-size", min=1),
    request_rate: float = typer.Option(math.inf, "--request-rate", help="Requests/s (inf: all at once)."),
    burstiness: float = typer.Option(1.0, "--burstiness", help="Gamma shape of arrivals (1: Poisson)."),
    slo_ttft_ms: Optional[float] = typer.Option(None, "--slo-ttft-ms", help="Goodput SLO on TTFT."),
    slo_tpot_ms: Optional[float] = typer.Option(None, "--slo-tpot-ms", help="Goodput SLO on TPOT."),
    slo_e2el_ms: Optional[float] = typer.Option(None, "--slo-e2el-ms", help="Goodput SLO on E2EL."),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Measure serving points, draw the Pareto frontier, compare with a baseline (exit 1 on regression).

    TTFT: first token received - request sent. E2EL: last token received - request sent (client side, streamed).

    TPOT: (E2EL - TTFT) / (output tokens - 1) per request. ITL: gaps between streamed chunks, pooled (!= TPOT).

    x90 interactivity: 1000 / P90 TPOT_ms (tok/s/user). Throughput per GPU: (prompt + output) tok/s / TP.

    Gate: exit 1 when tok/s/GPU or x90 at a common point falls by > --max-regression % and > the repeat spread.
    """
    from m3bench.bench.records import Slo
    from m3bench.bench.engine_options import EngineOptions
    from m3bench.bench.sweep import SweepConfig, TargetKind, run_sweep
    from m3bench.bench.workload import LengthRange, RangeKind

    if max_regression is not None and baseline is None:
        raise M3BenchError("--max-regression needs --baseline")
    if base_url and serve_http:
        raise M3BenchError("--serve starts its own server: drop --base-url (or --serve)")
    if range_kind not in (k.value for k in RangeKind):
        raise M3BenchError(f"--range-kind must be inferencex or vllm, not {range_kind!r}")
    engine = None
    if model is not None and not base_url:
        engine = EngineOptions(str(model), load_format, device, dtype, kv_cache_dtype, max_batch_size,
                               num_kv_blocks=num_kv_blocks, seed=seed, synthetic_acceptance=synthetic_acceptance,
                               draft_dir=None if draft is None else str(draft), draft_len=draft_len,
                               draft_kv=draft_kv, cuda_graphs=cuda_graphs,
                               async_scheduling=async_scheduling)
    elif synthetic_acceptance is not None or draft is not None:
        raise M3BenchError("--draft / --synthetic-acceptance apply to the bundled engine, not to --base-url")
    kind, path = _dataset(dataset)
    slo = Slo(slo_ttft_ms, slo_tpot_ms, slo_e2el_ms) if any(v is not None for v in (slo_ttft_ms, slo_tpot_ms, slo_e2el_ms)) else None
    target = TargetKind.EXTERNAL if base_url else TargetKind.SERVE if serve_http else TargetKind.INPROCESS
    cfg = SweepConfig(out_dir=out, engine=engine, tps=parse_int_list(tp, "tp"),
                      concurrencies=parse_int_list(concurrency, "concurrency"), lengths=length_pairs(isl, osl),
                      num_prompts=num_prompts, warmup=warmup, length_range=LengthRange(RangeKind(range_kind), range_ratio),
                      dataset=kind, dataset_path=path, target=target, base_url=base_url, api_key=api_key,
                      served_model=served_model_name, tokenizer=str(tokenizer or model) if (tokenizer or model) else None,
                      repeats=repeats, request_rate=request_rate, burstiness=burstiness, seed=seed, slo=slo)
    rows = run_sweep(cfg, on_point=_progress)
    if _finish(cfg, rows, baseline, max_regression, junit):
        raise typer.Exit(EXIT_REGRESSION)


def _progress(row: dict) -> None:
    if "error" in row:
        print(f"point {row['name']}: FAILED ({row['error']}; first error: {row.get('first_error')})", file=sys.stderr)
        return
    print(f"point {row['name']}: x90 {row['interactivity_x90']:.1f} tok/s/user, "
          f"{row['total_tok_per_s_per_gpu']:.1f} tok/s/GPU, failed {row['num_failed']}", file=sys.stderr)
    if row.get("num_wrong_output_len"):
        print(f"  warning: {row['num_wrong_output_len']} requests did not return the asked output length "
              "(does the server honour ignore_eos?)", file=sys.stderr)


def _finish(cfg, rows: list[dict], baseline: Path | None, max_regression: float | None, junit: Path | None) -> bool:
    """Write results, plot, table and JUnit; True when the gate fails (a regression or a failed point)."""
    from m3bench.bench.pareto import frontier
    from m3bench.bench.plot import plot_pareto
    from m3bench.bench.sweep import X_KEY, Y_KEY, compare, config_summary, load_results, write_results

    ok = [r for r in rows if "error" not in r]
    front = frontier(ok, x=lambda r: r[X_KEY], y=lambda r: r[Y_KEY])
    base_rows = load_results(baseline) if baseline is not None else []
    changes = compare(rows, base_rows, max_regression)
    from m3bench.provenance import sweep_provenance

    json_path, csv_path = write_results(cfg.out_dir, rows, front, changes,
                                        {**config_summary(cfg), "provenance": sweep_provenance(cfg)})
    if ok:
        plot_pareto(ok, Path(cfg.out_dir) / "pareto.png", [r for r in base_rows if "error" not in r])
    _table(rows, front, changes)
    _overhead(ok)
    failed = [r for r in rows if "error" in r]
    regressions = [c for c in changes if c.regression]
    if junit is not None:
        _junit(junit, rows, changes)
    print(f"wrote {json_path}, {csv_path}" + (f", {Path(cfg.out_dir) / 'pareto.png'}" if ok else ""), file=sys.stderr)
    if regressions:
        print(f"REGRESSION at {len(regressions)} gated figure(s) (> {max_regression}% and > run-to-run spread)",
              file=sys.stderr)
    return bool(regressions or failed)


def _table(rows: list[dict], front: list[dict], changes) -> None:
    from rich.console import Console
    from rich.table import Table

    keys = {(r["tp"], r["concurrency"], r["isl"], r["osl"]) for r in front}
    delta = {(c.key, c.metric): c for c in changes}
    t = Table(title="m3bench sweep (client side; ITL = chunk gaps, TPOT per request)")
    for col in ("TP", "C", "ISL", "OSL", "req/s", "out tok/s", "tok/s/GPU", "TTFT p50 ms", "TTFT p99 ms",
                "TPOT p50 ms", "TPOT p90 ms", "ITL p50 ms", "x90 tok/s/user", "AL", "failed", "frontier", "vs baseline"):
        t.add_column(col, justify="right")
    for r in rows:
        key = (r["tp"], r["concurrency"], r["isl"], r["osl"])
        if "error" in r:
            t.add_row(*map(str, key), *["-"] * 10, str(r.get("num_failed", "?")), "", f"[red]{r['error']}[/red]")
            continue
        t.add_row(*map(str, key), f"{r['request_per_s']:.2f}", f"{r['output_tok_per_s']:.1f}",
                  f"{r['total_tok_per_s_per_gpu']:.1f}", f"{r['ttft_ms_median']:.1f}", f"{r['ttft_ms_p99']:.1f}",
                  f"{r['tpot_ms_median']:.2f}", f"{r['tpot_ms_p90']:.2f}", f"{r['itl_ms_median']:.2f}",
                  f"{r['interactivity_x90']:.1f}", _al_text(r), str(r["num_failed"]), "*" if key in keys else "",
                  _change_text(delta, key))
    console = Console(stderr=True)
    if not console.is_terminal:
        console = Console(stderr=True, width=220)
    console.print(t)


def _al_text(row: dict) -> str:
    """Acceptance length of the measured window ("2.50 syn" when forced by --synthetic-acceptance)."""
    al = row.get("spec_acceptance_length")
    return "-" if al is None else f"{al:.2f}" + (" syn" if row.get("synthetic") else "")


def _overhead(rows: list[dict]) -> None:
    """State what the client itself costs: parse time per chunk, and the ITL it shows against an instant target."""
    per_chunk = [r["client_us_per_chunk"] for r in rows if r.get("client_us_per_chunk") is not None]
    if per_chunk:
        floor = max(rows, key=lambda r: r["client_floor_itl_ms"])
        print(f"client overhead: {max(per_chunk):.1f} us per chunk (parse + bookkeeping, worst point); ITL floor "
              f"against an instant target {floor['client_floor_itl_ms']:.3f} ms at C{floor['concurrency']}",
              file=sys.stderr)


def _change_text(delta: dict, key: tuple) -> str:
    parts = []
    for metric, label in (("total_tok_per_s_per_gpu", "tput"), ("interactivity_x90", "x90")):
        c = delta.get((key, metric))
        if c is not None:
            colour = "red" if c.regression else "green" if c.change_pct >= 0 else "yellow"
            parts.append(f"[{colour}]{label} {c.change_pct:+.1f}%[/{colour}]")
    return " ".join(parts)


def _junit(path: Path, rows: list[dict], changes) -> None:
    from m3bench.junit import JUnitCase, write_junit

    cases = []
    for r in rows:
        key = (r["tp"], r["concurrency"], r["isl"], r["osl"])
        name = f"tp{key[0]}_c{key[1]}_isl{key[2]}_osl{key[3]}"
        if "error" in r:
            cases.append(JUnitCase("m3bench.sweep", name, failure=f"point failed: {r['error']}", failure_type="PointFailed"))
            continue
        bad = [c for c in changes if c.key == key and c.regression]
        out = f"x90 {r['interactivity_x90']:.2f} tok/s/user, {r['total_tok_per_s_per_gpu']:.2f} tok/s/GPU"
        msg = "; ".join(f"{c.metric} {c.change_pct:+.1f}% (spread {c.spread_pct:.1f}%)" for c in bad) or None
        cases.append(JUnitCase("m3bench.sweep", name, out, msg))
    write_junit(path, "m3bench.sweep", cases)
