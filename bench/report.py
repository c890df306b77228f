"""Results as ratios, a Markdown table and PNG plots (pure, except the plot files)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .stats import ratio

# What ours is compared with: the peer in three configurations, Trainer v2, and the
# physical limit (bench.baseline: the same objects from a minimal client, at once or
# with the launcher after the workers are Ready; only "pods").
THEIRS = (
    "mpi-tuned",
    "mpi",
    "mpi-defaults",
    "trainer",
    "baseline",
    "baseline-ordered",
    "baseline-unlimited",
)
# Ours as shipped, and without the gang (the scheduling mpi-operator's pods get).
OURS = ("ours", "ours-nogang")
LABELS = {
    "ours": "horovod-operator",
    "ours-nogang": "horovod-operator (no gang, as mpi-operator)",
    "mpi-tuned": "mpi-operator (same QPS, work queue unthrottled)",
    "mpi": "mpi-operator (same QPS)",
    "mpi-defaults": "mpi-operator (defaults)",
    "trainer": "Kubeflow Trainer v2 + JobSet (same QPS)",
    "baseline": "minimal client (same QPS)",
    "baseline-unlimited": "minimal client (no rate limit)",
    "baseline-ordered": "minimal client, launcher after Ready (same QPS)",
}
SINGLE_MEASURES = (
    ("pods", "create -> all pods (workers + launcher)"),
    ("running", "create -> job Running"),
    ("status_propagation", "launcher Succeeded -> job Succeeded"),
)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _single_ratio(a: Any, b: Any) -> float | None:
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        return None
    return ratio(a, b)


def _plain_ratio(a: Any, b: Any) -> float | None:
    x, y = _num(a), _num(b)
    if x is None or y is None or not y:
        return None
    return round(x / y, 3)


def ratios(res: Mapping[str, Any]) -> dict[str, Any]:
    """ours / theirs for every measure both have, against each mpi-operator configuration
    and the minimal client; for each of our configurations that ran."""
    out: dict[str, Any] = {}
    for mine, theirs in itertools.product(OURS, THEIRS):
        r: dict[str, Any] = {}
        for size, by_op in (res.get("single") or {}).items():
            ours, other = by_op.get(mine) or {}, by_op.get(theirs) or {}
            for key, _ in SINGLE_MEASURES:
                value = _single_ratio(ours.get(key), other.get(key))
                if value is not None:
                    r[f"1x{size} {key}"] = value
            w = _plain_ratio(
                (ours.get("api_per_job") or {}).get("writes (total)"),
                (other.get("api_per_job") or {}).get("writes (total)"),
            )
            # Trainer's pods are the Job controller's writes, not its own: no like for like.
            if w is not None and theirs != "trainer":
                r[f"1x{size} api writes/job"] = w
        burst = res.get("burst") or {}
        for key in ("all_pods", "all_running"):
            value = _plain_ratio(
                (burst.get(mine) or {}).get(key), (burst.get(theirs) or {}).get(key)
            )
            if value is not None:
                r[f"burst {key}"] = value
        idle = res.get("idle") or {}
        value = _plain_ratio(
            (idle.get(mine) or {}).get("rss_mb"), (idle.get(theirs) or {}).get("rss_mb")
        )
        if value is not None:
            r["idle rss"] = value
        if r:
            out[f"{mine}/{theirs}"] = r
    return out


def _fmt_stat(stat: Any) -> str:
    if not isinstance(stat, Mapping) or not stat.get("n"):
        return "-"
    return f"{stat['median']:.2f} / {stat['p95']:.2f} (n={stat['n']})"


def cpu_ms_per_pod(entry: Any, size: int) -> float | None:
    """The operator's CPU over a single-job scenario, per worker pod it ran (each pod
    is about four watch events: added, scheduled, ready, deleted)."""
    if not isinstance(entry, Mapping) or "error" in entry:
        return None
    cpu = _num((entry.get("process") or {}).get("cpu_seconds"))
    runs = _num((entry.get("pods") or {}).get("n"))
    if cpu is None or not runs:
        return None
    return 1000 * cpu / (runs * size)


def _fmt(value: Any, unit: str = "", digits: int = 2) -> str:
    num = _num(value)
    return "-" if num is None else f"{num:.{digits}f}{unit}"


def _ops(res: Mapping[str, Any]) -> list[str]:
    known = [*OURS, *THEIRS]
    ops = list((res.get("meta") or {}).get("operators") or {})
    if not ops:
        return known
    # results.json is written with sorted keys: put ours first again.
    return [o for o in known if o in ops] + [o for o in ops if o not in known]


def table(res: Mapping[str, Any]) -> str:
    """Every measure as Markdown tables: seconds as median / p95 (n), then ratios."""
    ops = _ops(res)
    head = "| measure | " + " | ".join(LABELS.get(o, o) for o in ops) + " |"
    rule = "|---|" + "---|" * len(ops)
    lines = ["### Latency (seconds, median / p95 over n runs)", "", head, rule]
    for size, by_op in sorted((res.get("single") or {}).items(), key=lambda kv: int(kv[0])):
        for key, label in SINGLE_MEASURES:
            cells = []
            for o in ops:
                entry = by_op.get(o) or {}
                cells.append("error" if "error" in entry else _fmt_stat(entry.get(key)))
            lines.append(f"| 1 job x {size} workers: {label} | " + " | ".join(cells) + " |")
        cells = [_fmt(cpu_ms_per_pod(by_op.get(o), int(size)), " ms", 2) for o in ops]
        lines.append(
            f"| 1 job x {size} workers: operator CPU per worker pod | " + " | ".join(cells) + " |"
        )
    burst = res.get("burst") or {}
    if burst:
        any_burst = next(iter(burst.values()))
        shape = f"{any_burst.get('jobs', '?')} x {any_burst.get('workers', '?')}"
        for key, label in (("all_pods", "every pod exists"), ("all_running", "every job Running")):
            cells = []
            for o in ops:
                entry = burst.get(o)
                cells.append(
                    "not run"
                    if entry is None
                    else "error"
                    if "error" in entry
                    else _fmt(entry.get(key), " s")
                )
            lines.append(f"| burst {shape}: {label} | " + " | ".join(cells) + " |")
        for key, label, unit in (
            ("cpu_seconds", "operator CPU seconds during the burst", " s"),
            ("rss_peak_mb", "operator peak RSS during the burst", " MB"),
        ):
            cells = []
            for o in ops:
                entry = burst.get(o)
                proc = (entry or {}).get("process") or {}
                cells.append(_fmt(proc.get(key), unit, 1) if entry else "not run")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    idle = res.get("idle") or {}
    if idle:
        any_idle = next(iter(idle.values()))
        n = any_idle.get("jobs", "?")
        for key, label, unit, digits in (
            ("rss_mb", f"RSS idle with {n} finished jobs", " MB", 1),
            ("idle_cpu_seconds", "CPU seconds in the idle window", " s", 2),
            ("idle_window_seconds", "idle window", " s", 0),
            ("startup_cpu_seconds", f"CPU seconds to start with {n} jobs, less with none", " s", 2),
            ("startup_cpu_no_jobs_seconds", "CPU seconds to start with no jobs", " s", 2),
        ):
            cells = []
            for o in ops:
                entry = idle.get(o)
                cells.append(_fmt((entry or {}).get(key), unit, digits) if entry else "not run")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")

    api_rows = _api_rows(res, ops)
    if api_rows:
        lines += ["", "### API requests per job (audit log, by verb and resource)", "", head, rule]
        lines += api_rows

    rat = res.get("ratios") or ratios(res)
    if rat:
        lines += ["", "### Ratios ours/theirs (below 1.0: ours is faster or smaller)", ""]
        cols = list(rat)
        keys = sorted({k for r in rat.values() for k in r})
        lines.append("| measure | " + " | ".join(cols) + " |")
        lines.append("|---|" + "---|" * len(cols))
        for k in keys:
            lines.append(f"| {k} | " + " | ".join(_fmt(rat[c].get(k), "", 2) for c in cols) + " |")
    meta = res.get("meta") or {}
    if meta:
        lines += [
            "",
            f"Load average (1/5/15 min) at start {meta.get('loadavg_start')}, "
            f"at end {meta.get('loadavg_end')}; {meta.get('machine', {}).get('cores')} cores.",
        ]
    return "\n".join(lines)


def _api_rows(res: Mapping[str, Any], ops: list[str]) -> list[str]:
    rows: list[str] = []
    sources: list[tuple[str, Mapping[str, Any]]] = []
    for size, by_op in sorted((res.get("single") or {}).items(), key=lambda kv: int(kv[0])):
        sources.append((f"1 x {size}", by_op))
    if res.get("burst"):
        sources.append(("burst", res["burst"]))
    for title, by_op in sources:
        per_op = {o: (by_op.get(o) or {}).get("api_per_job") or {} for o in ops}
        keys = sorted({k for v in per_op.values() for k in v}, key=lambda k: ("total" in k, k))
        for k in keys:
            cells = [_fmt(per_op[o].get(k), "", 1) if per_op[o] else "-" for o in ops]
            rows.append(f"| {title}: {k} | " + " | ".join(cells) + " |")
    return rows


def plots(res: Mapping[str, Any], out: Path, prefix: str = "") -> list[Path]:
    """latency vs workers (both operators), the burst, and API writes per job."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    ops = _ops(res)
    colors = {
        "ours": "tab:green",
        "ours-nogang": "tab:olive",
        "mpi-tuned": "tab:purple",
        "mpi": "tab:blue",
        "mpi-defaults": "tab:gray",
        "trainer": "tab:orange",
        "baseline": "tab:brown",
        "baseline-ordered": "tab:red",
        "baseline-unlimited": "tab:cyan",
    }
    # The minimal clients are limits, not peers: dashed.
    styles = {k: "--" for k in ("baseline", "baseline-ordered", "baseline-unlimited")}
    written: list[Path] = []
    single = res.get("single") or {}
    if single:
        sizes = sorted(single, key=int)
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, key, title in (
            (axes[0], "pods", "create -> all pods created"),
            (axes[1], "running", "create -> job Running"),
        ):
            for o in ops:
                xs, med, lo, hi = [], [], [], []
                for s in sizes:
                    stat = (single[s].get(o) or {}).get(key)
                    if isinstance(stat, Mapping) and stat.get("n"):
                        xs.append(int(s))
                        med.append(stat["median"])
                        lo.append(0.0)
                        hi.append(max(0.0, stat["p95"] - stat["median"]))
                if xs:
                    ax.errorbar(
                        xs,
                        med,
                        yerr=[lo, hi],
                        marker="o",
                        capsize=3,
                        label=LABELS.get(o, o),
                        color=colors.get(o),
                        linestyle=styles.get(o, "-"),
                    )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("workers in the job")
            ax.set_ylabel("seconds (median; bar to p95)")
            ax.set_title(title)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{prefix}latency-vs-workers.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    burst = res.get("burst") or {}
    runs = [o for o in ops if isinstance(burst.get(o), Mapping) and "all_pods" in burst[o]]
    if runs:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        width = 0.38
        for i, key in enumerate(("all_pods", "all_running")):
            pos = [j + (i - 0.5) * width for j in range(len(runs))]
            ax.bar(
                pos,
                # No bar where a peer has no such state (a TrainJob is never Running).
                [float("nan") if burst[o].get(key) is None else burst[o][key] for o in runs],
                width,
                label="every pod exists" if key == "all_pods" else "every job Running",
            )
        ax.set_xticks(range(len(runs)), [LABELS.get(o, o) for o in runs], fontsize=8)
        shape = f"{burst[runs[0]]['jobs']} jobs x {burst[runs[0]]['workers']} workers"
        ax.set_title(f"burst of {shape} (seconds)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{prefix}burst.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
