"""`m3bench sweep`: a serving Pareto sweep over TP x concurrency x (ISL, OSL), with a CI gate.

    m3bench sweep --model ckpt --load-format dummy --concurrency 1..64 --isl 1024 --osl 256 --out out/
    m3bench sweep --base-url http://127.0.0.1:8000 --tokenizer ckpt --tp 4 --concurrency 4,16,40 --out out/
    m3bench sweep --model ckpt --out out2/ --baseline out/ --max-regression 5 --repeats 3 --junit sweep.xml
    m3bench sweep --model ckpt --dataset trace:conversation_trace.jsonl --max-requests 64 --schedule timestamps \
        --time-scale 0.5 --concurrency 16 --pareto-x e2e-p90 --out out3/     # replay a Mooncake trace

Figures (vLLM `bench serve` definitions): TTFT, TPOT = (E2EL - TTFT) / (output tokens - 1),
ITL = gaps between streamed chunks (!= TPOT with speculative decoding), E2EL; interactivity
x90 = 1000 / P90 TPOT_ms (tok/s/user); E2E-normalized interactivity P90 = 1 / P90(E2EL_s / OSL)
(tok/s/user); throughput per GPU = total (prompt + output) tok/s / TP. A trace replay adds the
prefix-cache hit rate reached (engine counters, or a server's /metrics) and the one possible.
Writes out/points/*.json as each point finishes (a rerun resumes), then out/results.{json,csv}
and out/pareto.png. Exit 1 when a gated figure regressed (or a point failed), 2 on bad input.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Optional

import typer

from m3bench.cli import validate
from m3bench.cli.engine_flags import ENGINE, EngineFlags, engine_flags
from m3bench.cli.errors import EXIT_REGRESSION, M3BenchError, user_errors
from m3bench.cli.out_lock import out_lock
from m3bench.numbers import is_int


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
    if value.startswith("trace:"):
        path = Path(value[len("trace:"):])
        if not path.is_file():
            raise M3BenchError(f"--dataset trace: no such file: {path}")
        return DatasetKind.TRACE, path
    path = Path(value)
    if not path.is_file():
        raise M3BenchError(f"--dataset: expected random, gsm8k, trace:FILE or a jsonl file, got {value!r}")
    return DatasetKind.JSONL, path


def _trace_spec(path: Path | None, offset: int, max_requests: int | None, scale: float, schedule: str,
                time_scale: float):
    """The trace replay's settings (None for other datasets); flags that only a trace takes are refused elsewhere."""
    from m3bench.bench.trace import TraceSchedule, TraceSpec

    if schedule not in (s.value for s in TraceSchedule):
        raise M3BenchError(f"--schedule must be concurrency or timestamps, not {schedule!r}")
    if path is None:
        if (offset, max_requests, scale, schedule, time_scale) != (0, None, 1.0, "concurrency", 1.0):
            raise M3BenchError("--trace-offset / --max-requests / --trace-scale / --schedule / --time-scale "
                               "need --dataset trace:FILE")
        return None
    return TraceSpec(path, offset, max_requests, scale, TraceSchedule(schedule), time_scale)


@user_errors
@engine_flags
def sweep(
    model: Optional[Path] = typer.Option(None, "--model", help="Checkpoint directory (the bundled engine)."),
    concurrency: str = typer.Option("1,4,16,40,64", "--concurrency", help="List (1,4,16) or doubling range (1..64)."),
    isl: str = typer.Option("1024", "--isl", help="Input lengths in tokens (paired with --osl; random dataset only)."),
    osl: str = typer.Option("256", "--osl", help="Output lengths in tokens (ignore_eos)."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", min=1, help="Measured requests (10 x C)."),
    warmup: Optional[int] = typer.Option(None, "--warmup", min=0, help="Uncounted warm-up requests (2 x C)."),
    range_kind: str = typer.Option("inferencex", "--range-kind",
                                   help="inferencex: lengths in [r L, L]; vllm: [L(1-r), L(1+r)]."),
    range_ratio: Optional[float] = typer.Option(None, "--range-ratio", help="r (0.8 inferencex, 0 vllm)."),
    dataset: str = typer.Option("random", "--dataset", help="random, gsm8k, a jsonl file (prompt/text/question), "
                                "or trace:FILE (Mooncake / AIPerf mooncake_trace lines, prompts from hash_ids)."),
    max_requests: Optional[int] = typer.Option(None, "--max-requests", min=1,
                                               help="Trace: requests replayed per point (default: all after "
                                               "the offset)."),
    trace_offset: int = typer.Option(0, "--trace-offset", min=0, help="Trace: requests skipped at its start."),
    trace_scale: float = typer.Option(1.0, "--trace-scale", help="Trace: block size (512) and every length times F."),
    schedule: str = typer.Option("concurrency", "--schedule", help="Trace: concurrency (trace order behind the "
                                 "cap) or timestamps (sent at the trace's times, the cap still held)."),
    time_scale: float = typer.Option(1.0, "--time-scale", help="Trace timestamps times this (0.5: twice as fast)."),
    pareto_x: str = typer.Option("x90", "--pareto-x", help="Frontier x axis: x90 or e2e-p90."),
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
    request_rate: float = typer.Option(math.inf, "--request-rate", help="Requests/s (inf: all at once)."),
    burstiness: float = typer.Option(1.0, "--burstiness", help="Gamma shape of arrivals (1: Poisson)."),
    slo_ttft_ms: Optional[float] = typer.Option(None, "--slo-ttft-ms", help="Goodput SLO on TTFT."),
    slo_tpot_ms: Optional[float] = typer.Option(None, "--slo-tpot-ms", help="Goodput SLO on TPOT."),
    slo_e2el_ms: Optional[float] = typer.Option(None, "--slo-e2el-ms", help="Goodput SLO on E2EL."),
    seed: int = typer.Option(0, "--seed", help="Workload and engine seed."),
    engine: EngineFlags = ENGINE,
) -> None:
    """Measure serving points, draw the Pareto frontier, compare with a baseline (exit 1 on regression).

    TTFT: first token received - request sent. E2EL: last token received - request sent (client side, streamed).

    TPOT: (E2EL - TTFT) / (output tokens - 1) per request. ITL: gaps between streamed chunks, pooled (!= TPOT).

    x90 interactivity: 1000 / P90 TPOT_ms (tok/s/user). Throughput per GPU: (prompt + output) tok/s / TP.

    Host ms/step (in-process engine only): engine step wall time - its forward time, p50 and p90 over the
    window's steps. Device idle: 1 - the steps' forward time / window wall time.

    Gate: exit 1 when tok/s/GPU or x90 at a common point falls by > --max-regression % and > the repeat spread.
    """
    from m3bench.bench.records import Slo
    from m3bench.bench.pareto import ParetoX
    from m3bench.bench.sweep import SweepConfig, TargetKind, check_engines, run_sweep
    from m3bench.bench.workload import LengthRange, RangeKind

    if pareto_x not in (a.value for a in ParetoX):
        raise M3BenchError(f"--pareto-x must be x90 or e2e-p90, not {pareto_x!r}")
    if max_regression is not None and baseline is None:
        raise M3BenchError("--max-regression needs --baseline")
    if base_url and serve_http:
        raise M3BenchError("--serve starts its own server: drop --base-url (or --serve)")
    if range_kind not in (k.value for k in RangeKind):
        raise M3BenchError(f"--range-kind must be inferencex or vllm, not {range_kind!r}")
    tps = parse_int_list(engine.tp, "tp")
    engine_cfg = None
    if model is not None and not base_url:
        engine_cfg = engine.unresolved(model, seed=seed, tp=tps[0])
        check_engines(engine_cfg, tps)  # every TP's engine settings valid on this machine: exit 2 before any work
    elif engine.synthetic_acceptance is not None or engine.draft is not None:
        raise M3BenchError("--draft / --synthetic-acceptance apply to the bundled engine, not to --base-url")
    kind, path = _dataset(dataset)
    trace = _trace_spec(path if kind.value == "trace" else None, trace_offset, max_requests, trace_scale, schedule,
                        time_scale)
    slo = Slo(slo_ttft_ms, slo_tpot_ms, slo_e2el_ms) if any(v is not None for v in (slo_ttft_ms, slo_tpot_ms, slo_e2el_ms)) else None
    target = TargetKind.EXTERNAL if base_url else TargetKind.SERVE if serve_http else TargetKind.INPROCESS
    cfg = SweepConfig(out_dir=out, engine=engine_cfg, tps=tps,
                      concurrencies=parse_int_list(concurrency, "concurrency"), lengths=length_pairs(isl, osl),
                      num_prompts=num_prompts, warmup=warmup, length_range=LengthRange(RangeKind(range_kind), range_ratio),
                      dataset=kind, dataset_path=path, target=target, base_url=base_url, api_key=api_key,
                      served_model=served_model_name, tokenizer=str(tokenizer or model) if (tokenizer or model) else None,
                      repeats=repeats, request_rate=request_rate, burstiness=burstiness, seed=seed, slo=slo,
                      trace=trace)
    _check_before_work(cfg, model, baseline, junit, max_regression)
    with out_lock(out, "sweep"):
        rows = run_sweep(cfg, on_point=_progress)
        regressed = _finish(cfg, rows, baseline, max_regression, junit, ParetoX(pareto_x))
    if regressed:
        raise typer.Exit(EXIT_REGRESSION)


def _check_before_work(cfg, model: Path | None, baseline: Path | None, junit: Path | None,
                       max_regression: float | None) -> None:
    """Paths, the baseline, the target and the lengths against the context: refused before any point runs."""
    from m3bench.bench.sweep import load_results
    from m3bench.bench.sweep_checks import check_lengths, check_output_lengths, probe_server

    cfg.check()
    check_output_lengths(cfg)
    validate.out_directory(cfg.out_dir, "--out")
    if junit is not None:
        validate.output_file(junit, "--junit")
    if baseline is not None:
        load_results(baseline)
    for flag, value in (("--request-rate", None if cfg.request_rate == math.inf else cfg.request_rate),
                        ("--burstiness", cfg.burstiness), ("--max-regression", max_regression)):
        validate.finite(value, flag)
    if cfg.request_rate <= 0 or cfg.burstiness <= 0:
        raise M3BenchError("--request-rate and --burstiness must be > 0")
    if max_regression is not None and not 0 <= max_regression < 100:  # the gated figures are rates: a fall is < 100%
        raise M3BenchError(f"--max-regression must be a percentage from 0 to below 100 (at 100 or more no fall of "
                           f"throughput or x90 can fail the gate; below 0 an unchanged run fails), got {max_regression}")
    if model is not None and cfg.engine is not None and not model.is_dir():
        raise M3BenchError(f"--model {model} is not a directory")
    if cfg.base_url:
        check_lengths(cfg, probe_server(cfg.base_url, cfg.api_key))
    elif model is not None:
        check_lengths(cfg, _max_positions(model))


def _max_positions(model: Path) -> int | None:
    """config.json's max_position_embeddings (an upper bound of the context), None when not readable."""
    import json

    try:
        value = json.loads((model / "config.json").read_text(encoding="utf-8")).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return value if is_int(value) and value > 0 else None


def _progress(row: dict) -> None:
    if "error" in row:
        print(f"point {row['name']}: FAILED ({row['error']}; first error: {row.get('first_error')})", file=sys.stderr)
        return
    print(f"point {row['name']}: x90 {row['interactivity_x90']:.1f} tok/s/user, E2E-int P90 "
          f"{row['interactivity_e2e_p90']:.1f} tok/s/user, {row['total_tok_per_s_per_gpu']:.1f} tok/s/GPU, "
          f"failed {row['num_failed']}{_trace_text(row)}", file=sys.stderr)
    if row.get("num_wrong_prompt_len"):
        print(f"  warning: {row['num_wrong_prompt_len']} prompts arrived at another token count than built "
              f"({row['prompt_len_mismatch_tokens']:+d} tokens in all; sent as {row['prompt_as']})", file=sys.stderr)
    if row.get("num_wrong_output_len"):
        print(f"  warning: {row['num_wrong_output_len']} requests did not return the asked output length "
              "(does the server honour ignore_eos?)", file=sys.stderr)


def _trace_text(row: dict) -> str:
    """", skipped 2 (too long), prefix hit 0.41 of 0.52 possible" for a trace replay; "" otherwise."""
    if "prefix_hit_rate_possible" not in row:
        return ""
    return f", skipped {row['num_skipped_too_long']} (too long), prefix hit {_rate(row)}"


def _rate(row: dict) -> str:
    reached, possible = row.get("prefix_cache_hit_rate"), row.get("prefix_hit_rate_possible")
    if possible is None:
        return "-"
    return ("?" if reached is None else f"{reached:.3f}") + f" / {possible:.3f}"


def _finish(cfg, rows: list[dict], baseline: Path | None, max_regression: float | None, junit: Path | None,
            x_axis=None) -> bool:
    """Write results, plot, table and JUnit; True when the gate fails (a regression or a failed point)."""
    from m3bench.bench.pareto import ParetoX, frontier
    from m3bench.bench.plot import plot_pareto
    from m3bench.bench.sweep import Y_KEY, compare, config_summary, load_results, write_results

    x_axis = x_axis or ParetoX.X90
    ok = [r for r in rows if "error" not in r]
    on_axis = [r for r in ok if r.get(x_axis.key) is not None]  # (points resumed from before the axis existed)
    front = frontier(on_axis, x=lambda r: r[x_axis.key], y=lambda r: r[Y_KEY])
    base_rows = load_results(baseline) if baseline is not None else []
    changes = compare(rows, base_rows, max_regression)
    from m3bench.provenance import sweep_provenance

    json_path, csv_path = write_results(cfg.out_dir, rows, front, changes,
                                        dict(config_summary(cfg), pareto_x=x_axis.value, provenance=sweep_provenance(cfg)))
    if on_axis:
        plot_pareto(on_axis, Path(cfg.out_dir) / "pareto.png", [r for r in base_rows if "error" not in r],
                    x_axis=x_axis)
    _table(rows, front, changes)
    _overhead(ok)
    failed = [r for r in rows if "error" in r]
    regressions = [c for c in changes if c.regression]
    if junit is not None:
        _junit(junit, rows, changes)
    png = f", {Path(cfg.out_dir) / 'pareto.png'}" if on_axis else ""
    print(f"wrote {json_path}, {csv_path}{png}", file=sys.stderr)
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
                "TPOT p50 ms", "TPOT p90 ms", "ITL p50 ms", "x90 tok/s/user", "E2E-int P90", "AL", "prefix hit",
                "host ms/step p50", "host ms/step p90", "device idle", "failed", "frontier", "vs baseline"):
        t.add_column(col, justify="right")
    for r in rows:
        key = (r["tp"], r["concurrency"], r["isl"], r["osl"])
        if "error" in r:
            t.add_row(*map(str, key), *["-"] * 15, str(r.get("num_failed", "?")), "", f"[red]{r['error']}[/red]")
            continue
        t.add_row(*map(str, key), f"{r['request_per_s']:.2f}", f"{r['output_tok_per_s']:.1f}",
                  f"{r['total_tok_per_s_per_gpu']:.1f}", f"{r['ttft_ms_median']:.1f}", f"{r['ttft_ms_p99']:.1f}",
                  f"{r['tpot_ms_median']:.2f}", f"{r['tpot_ms_p90']:.2f}", f"{r['itl_ms_median']:.2f}",
                  f"{r['interactivity_x90']:.1f}", _e2e_text(r), _al_text(r), _rate(r), *_host_text(r),
                  str(r["num_failed"]), "*" if key in keys else "",
                  _change_text(delta, key))
    console = Console(stderr=True)
    if not console.is_terminal:
        console = Console(stderr=True, width=250)
    console.print(t)


def _e2e_text(row: dict) -> str:
    """E2E-normalized interactivity P90 ("-" for a point resumed from a sweep that did not record it)."""
    value = row.get("interactivity_e2e_p90")
    return "-" if value is None else f"{value:.1f}"


def _al_text(row: dict) -> str:
    """Acceptance length of the measured window ("2.50 syn" when forced by --synthetic-acceptance)."""
    al = row.get("spec_acceptance_length")
    return "-" if al is None else f"{al:.2f}" + (" syn" if row.get("synthetic") else "")


def _host_text(row: dict) -> tuple[str, str, str]:
    """Host ms per engine step (p50, p90) and the device idle share; "-" where the engine is not in this
    process (bench/metrics.py compute_host_timing)."""
    if row.get("host_ms_per_step_median") is None:
        return "-", "-", "-"
    return (f"{row['host_ms_per_step_median']:.2f}", f"{row['host_ms_per_step_p90']:.2f}",
            f"{100 * row['device_idle_share']:.0f}%")


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
