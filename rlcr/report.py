"""The report: reports/report.md answering Q1-Q5 (the five questions of README.md) from the metrics files, plus PNG plots.

How a number gets into the report: the text is first written as a TEMPLATE in which every figure is
a placeholder `{{<file>::<key>::<format>}}` (made by `Sources.ref`), never a literal. `fill` then
replaces each placeholder by that key's value in that file (metrics/eval.json, metrics/train.json,
metrics/bootstrap.json, metrics/ablations/*.json, or params.yaml for the report's own thresholds)
and records where it put it: reports/report_sources.json lists {start, end, text, file, key, format,
value} for every figure. `fill` refuses a template with a digit outside a placeholder, a code span
(names such as `rg/gcd`, episode ids), a question label (Q1-Q5) or a link target, so a hand-written
figure cannot reach the report.

Verdicts read the same values: an effect is claimed only when its confidence interval (tasks
resampled, rlcr/evaluate.py) excludes the null value AND the comparison has at least
`report.min_tasks_for_claim` tasks; otherwise the report says it cannot say. Missing inputs (no
trained policy yet, no ablations, no evaluation) are listed and the questions they feed say so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EVAL, TRAIN, BOOT, PARAMS = "metrics/eval.json", "metrics/train.json", "metrics/bootstrap.json", "params.yaml"
SEEDS = "reports/ablation_summary.json"
"""Derived by this module from metrics/ablations (`ablation_summary`), written next to the report."""
RATES = "reports/rate_intervals.json"
"""Derived by this module from the behaviour counts (`rate_intervals`), written next to the report."""
RATE_COUNTS = {"false_approval_rate": ("behaviour/false_approvals_total", "behaviour/approvals_checked_total"),
               "idle_agents_per_hire": ("behaviour/idle_agents_total", "org/hires_total")}
"""Q5's rates: (events, chances) count keys of each, in eval.json runs and ablation files."""
ABLATIONS = "metrics/ablations"
PLACEHOLDER = re.compile(r"\{\{(?P<file>[^{}]+?)::(?P<key>[^{}]+?)::(?P<fmt>[^{}]*?)\}\}")
NOT_FIGURES = re.compile(r"`[^`\n]*`|\bQ[1-5]\b|\]\([^)\n]*\)")
"""Digits allowed outside placeholders: code spans (names, ids), question labels, link targets."""
PLOTS = {"learning_curves": "Learning curves per variant (plots/train.csv, plots/ablations)",
         "behaviour_over_training": "Behaviour metrics over training",
         "success_vs_critical_path": "Success vs critical path, company and single agent",
         "org_charts": "Org charts of sample company episodes"}


# ------------------------------------------------------------------------------------ sources


@dataclass
class Sources:
    """The metrics files, flat {key: value} each, by path relative to the project root."""

    files: dict[str, dict[str, Any]]
    missing: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, root: Path, report_params: dict[str, Any]) -> Sources:
        files: dict[str, dict[str, Any]] = {PARAMS: {f"report.{k}": v for k, v in report_params.items()}}
        missing = []
        paths = [EVAL, TRAIN, BOOT, *sorted(str(p.relative_to(root)) for p in (root / ABLATIONS).glob("*.json"))]
        for rel in paths:
            if (root / rel).is_file():
                files[rel] = json.loads((root / rel).read_text())
            else:
                missing.append(rel)
        return cls(files, missing)

    def get(self, file: str, key: str) -> float | None:
        v = self.files.get(file, {}).get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    def has(self, file: str, *keys: str) -> bool:
        return all(self.get(file, k) is not None for k in keys)

    def ref(self, file: str, key: str, fmt: str = ".2f") -> str:
        """The placeholder of one figure; a key that is not there is a bug in the template code."""
        if key not in self.files.get(file, {}):
            raise KeyError(f"{file} has no key {key!r}")
        return f"{{{{{file}::{key}::{fmt}}}}}"

    def ci(self, file: str, key: str, fmt: str = ".2f") -> str:
        """`x [low, high]` for a key with `_ci_low`/`_ci_high` siblings (just `x` without them)."""
        if not self.has(file, f"{key}_ci_low", f"{key}_ci_high"):
            return self.ref(file, key, fmt)
        return f"{self.ref(file, key, fmt)} [{self.ref(file, key + '_ci_low', fmt)}, {self.ref(file, key + '_ci_high', fmt)}]"

    def show(self, file: str, key: str, fmt: str = ".2f") -> str:
        """`ci(...)` when the key is there, else `n/a` (a ratio over zero tokens, a group without episodes)."""
        return self.ci(file, key, fmt) if self.has(file, key) else "n/a"

    def ablation_files(self) -> list[str]:
        return sorted(f for f in self.files if f.startswith(ABLATIONS + "/"))


def format_value(value: Any, fmt: str) -> str:
    if fmt == "s":
        return str(value)
    if fmt == "d":
        return str(int(round(float(value))))
    return format(float(value), fmt)


def fill(template: str, sources: Sources) -> tuple[str, list[dict[str, Any]]]:
    """(report text, provenance of every figure in it); raises on a figure not from a placeholder."""
    loose = [m.group() for m in re.finditer(r"\d+", NOT_FIGURES.sub("", PLACEHOLDER.sub("", template)))]
    if loose:
        raise ValueError(f"hand-written figures in the report template: {loose[:10]}")
    out: list[str] = []
    spans: list[dict[str, Any]] = []
    pos = length = 0
    for m in PLACEHOLDER.finditer(template):
        out.append(template[pos:m.start()])
        length += m.start() - pos
        value = sources.files[m["file"]][m["key"]]
        text = format_value(value, m["fmt"])
        spans.append({"start": length, "end": length + len(text), "text": text, "file": m["file"], "key": m["key"],
                      "format": m["fmt"], "value": value})
        out.append(text)
        length += len(text)
        pos = m.end()
    out.append(template[pos:])
    return "".join(out), spans


def untraced_figures(text: str, spans: list[dict[str, Any]]) -> list[str]:
    """Digits in the report that neither a recorded span nor an allowed place explains (for tests)."""
    chars = list(text)
    for s in spans:
        chars[s["start"]:s["end"]] = " " * (s["end"] - s["start"])
    return re.findall(r"\d+", NOT_FIGURES.sub("", "".join(chars)))


# ----------------------------------------------------------------------------------- verdicts


def side(lo: float | None, hi: float | None, null: float) -> int:
    """+1 when the interval lies above `null`, -1 below, 0 when it contains it (or is missing)."""
    if lo is None or hi is None:
        return 0
    return 1 if lo > null else -1 if hi < null else 0


@dataclass
class Finding:
    """One question's answer: a word for the summary, its key evidence, and the section body."""

    answer: str
    evidence: str
    body: list[str]


def _enough(s: Sources, key: str) -> bool:
    return (s.get(EVAL, key) or 0.0) >= s.files[PARAMS]["report.min_tasks_for_claim"]


def _few(s: Sources) -> str:
    return f"fewer than {s.ref(PARAMS, 'report.min_tasks_for_claim', 'd')} tasks: no claim"


def eval_runs(s: Sources) -> list[str]:
    return sorted({k.split("/")[0] for k in s.files.get(EVAL, {}) if k.count("/") == 1 and k.endswith("/success")
                   and "__" in k})


def policy_comparisons(s: Sources) -> list[tuple[str, str]]:
    """(`<policy>_vs_<baseline>`, org) pairs present in eval.json."""
    keys = s.files.get(EVAL, {})
    return sorted({(k.split("/")[1], k.split("/")[2]) for k in keys if k.startswith("compare/") and "_vs_" in k
                   and not k.startswith("compare/company_vs_single/") and k.endswith("/success_diff")
                   and k.count("/") == 3})


def _headline(items: list[str], s: Sources) -> str:
    """The policy a summary speaks for: the first that is not the evaluation's baseline, else the first."""
    base = {c.split("_vs_")[1] for c, _ in policy_comparisons(s)}
    return next((p for p in items if p not in base), items[0])


# ---------------------------------------------------------------------------------- questions


def paired_policies(s: Sources, suffix: str = "success_diff") -> list[str]:
    """Policies with a company-vs-single comparison key ending in `suffix` in eval.json."""
    return sorted({k.split("/")[2] for k in s.files.get(EVAL, {})
                   if k.startswith("compare/company_vs_single/") and k.endswith("/" + suffix)})


def q1(s: Sources) -> Finding:
    policies = paired_policies(s)
    if not policies:
        return Finding("no data", "no policy rolled out both as a company and as a single agent",
                       ["No policy has been rolled out both as a company and as a single agent: nothing to compare."])
    body = ["| policy | success company | success single | difference | tokens ratio | modelled-time ratio "
            "| real-seconds ratio | tasks |", "|---|---|---|---|---|---|---|---|"]
    words, lines = {}, []
    m = s.ref(PARAMS, "report.noninferiority_margin")
    for p in policies:
        k = f"compare/company_vs_single/{p}/"
        body.append(f"| `{p}` | {s.ref(EVAL, k + 'success_company')} | {s.ref(EVAL, k + 'success_single')} | "
                    f"{s.ci(EVAL, k + 'success_diff', '+.2f')} | {s.show(EVAL, k + 'tokens_ratio')} | "
                    f"{s.show(EVAL, k + 'critical_path_ratio')} | {s.show(EVAL, k + 'seconds_ratio')} | {s.ref(EVAL, k + 'tasks', 'd')} |")
        if not _enough(s, k + "tasks"):
            words[p], why = "cannot say", _few(s)
        else:
            words[p], why = q1_verdict(s, EVAL, k + "success_diff_", k + "critical_path_ratio_", "an interval")
        lines.append(f"- `{p}`: **{words[p]}**: {why} (non-inferiority margin {m}).")
    head = _headline(policies, s)
    k = f"compare/company_vs_single/{head}/"
    ratio = s.show(EVAL, k + "critical_path_ratio")
    evidence = f"`{head}`: success difference {s.ci(EVAL, k + 'success_diff', '+.2f')}, modelled-time ratio {ratio}"
    intro = ["Company minus single agent on the same tasks at the same token budget. Modelled time is the company's "
             "critical path (the longest generation of each round, summed) against the single agent's total tokens; "
             "the article claims similar scores in about a quarter of the time.", "",
             "The same policy in both modes (the rollouts): RL trained it as a company only, so its single-agent "
             "mode had no RL of its own.", ""]
    trained = q1_ablation(s)
    if trained is None:
        return Finding(words[head], evidence, intro + body + [""] + lines)
    answer, trained_evidence, trained_body = trained
    return Finding(answer, trained_evidence, intro + body + [""] + lines + [""] + trained_body)


def q1_verdict(s: Sources, file: str, diff: str, ratio: str, what: str) -> tuple[str, str]:
    """(answer, why) of Q1 from a success difference and a modelled-time ratio with their intervals, the
    keys `<diff>ci_low`, `<diff>ci_high`, `<ratio>ci_low`, `<ratio>ci_high` of `file` (`what`: how the
    interval is named when it decides nothing)."""
    margin = s.files[PARAMS]["report.noninferiority_margin"]
    lo, hi = s.get(file, diff + "ci_low"), s.get(file, diff + "ci_high")
    t = side(s.get(file, ratio + "ci_low"), s.get(file, ratio + "ci_high"), 1.0)
    if lo is not None and lo > -margin and t < 0:
        return "yes", "the success difference stays above minus the margin and the modelled time is shorter"
    if (hi is not None and hi < 0) or t > 0:
        return "no", "the company scores lower" if hi is not None and hi < 0 else "the company is slower"
    return "cannot say", f"{what} includes the null value (no difference, or a time ratio of one)"


def q1_ablation(s: Sources) -> tuple[str, str, list[str]] | None:
    """Q1 between equally trained policies: the `collective` ablation (RL as a company) against `no_hiring`
    (RL as a single agent: same iterations, budget and tasks), per seed and across seeds (the per-seed
    differences' t-interval, as Q3); None without two seeds of both. This decides the summary's answer."""
    company, single = _ablation(s, "collective"), _ablation(s, "no_hiring")
    diff, ratio = "collective_vs_no_hiring/success_diff", "collective_vs_no_hiring/critical_path_ratio"
    if len(set(company) & set(single)) < 2 or not s.has(SEEDS, f"{diff}/ci_low", f"{ratio}/ci_low"):
        return None
    body = ["Equally trained (the ablations, causal): `collective` trained by RL as a company against `no_hiring` "
            "trained by RL as a single agent, the same iterations, token budget and tasks.", "",
            "| seed | company success | single success | company critical path, tokens | single tokens |",
            "|---|---|---|---|---|"]
    for seed in sorted(set(company) & set(single)):
        fa, fb = company[seed], single[seed]
        cells = []
        for f, v, metric in ((fa, "collective", "success"), (fb, "no_hiring", "success"),
                             (fa, "collective", "critical_path_tokens"), (fb, "no_hiring", "critical_path_tokens")):
            k = _variant_key(s.files[f], v, metric)
            cells.append(s.ci(f, k, ".2f" if metric == "success" else ".1f") if k else "n/a")
        body.append(f"| `{seed}` | " + " | ".join(cells) + " |")
    answer, why = q1_verdict(s, SEEDS, f"{diff}/", f"{ratio}/", "an across-seed interval")
    evidence = (f"equally trained, over {s.ref(SEEDS, f'{diff}/seeds', 'd')} seeds: success difference "
                f"{_seed_ci(s, diff, '+.2f')}, modelled-time ratio {_seed_ci(s, ratio)}")
    body += ["", f"Across seeds (a t-interval over the per-seed figures): success difference {_seed_ci(s, diff, '+.2f')}, "
             f"modelled-time ratio (company critical path over single tokens) {_seed_ci(s, ratio)}.", "",
             f"**{answer}**: {why} (non-inferiority margin {s.ref(PARAMS, 'report.noninferiority_margin')}); this "
             "comparison answers the summary, where both agents had the same training."]
    return answer, evidence, body


def q2(s: Sources) -> Finding:
    policies = paired_policies(s, "short/success_diff")
    if not policies:
        return Finding("no data", "no short tasks run both as a company and as a single agent",
                       ["No short tasks were run both as a company and as a single agent."])
    body = ["| policy | tasks | modelled-time ratio | success difference | tokens ratio |", "|---|---|---|---|---|"]
    words, lines = {}, []
    short_max, long_min = s.get(EVAL, "eval/short_max"), s.get(EVAL, "eval/long_min")
    for p in policies:
        lengths = sorted({int(key.split("/")[4]) for key in s.files.get(EVAL, {})
                          if key.startswith(f"compare/company_vs_single/{p}/difficulty/")})
        alone = {ds[0] for ds in ([d for d in lengths if short_max is not None and d <= short_max],
                                  [d for d in lengths if long_min is not None and d >= long_min]) if len(ds) == 1}
        # a length that is all of the short (or long) tasks would repeat that row: left out
        for part in ("short", *(f"difficulty/{d}" for d in lengths if d not in alone), "long"):
            k = f"compare/company_vs_single/{p}/{part}/"
            if not s.has(EVAL, k + "success_diff"):
                continue
            ratio = s.show(EVAL, k + "critical_path_ratio")
            tokens = s.show(EVAL, k + "tokens_ratio")
            label = part if part in ("short", "long") else f"`{part}`"
            body.append(f"| `{p}` {label} | {s.ref(EVAL, k + 'tasks', 'd')} | {ratio} | "
                        f"{s.ci(EVAL, k + 'success_diff', '+.2f')} | {tokens} |")
        k = f"compare/company_vs_single/{p}/short/"
        if not _enough(s, k + "tasks"):
            words[p], why = "cannot say", _few(s)
        else:
            words[p], why = q2_verdict(s.get(EVAL, k + "critical_path_ratio_ci_low"),
                                       s.get(EVAL, k + "critical_path_ratio_ci_high"), "interval")
        # three decimals: a bound of 0.9985 decides "below one" but prints as 1.00 with two
        lines.append(f"- `{p}`: **{words[p]}**: {why}; short-task ratio {s.show(EVAL, k + 'critical_path_ratio', '.3f')}.")
    head = _headline(policies, s)
    k = f"compare/company_vs_single/{head}/short/"
    ratio = s.show(EVAL, k + "critical_path_ratio", ".3f")
    short = (f"short: difficulty up to {s.ref(EVAL, 'eval/short_max', 'd')}, long: from {s.ref(EVAL, 'eval/long_min', 'd')}"
             if s.has(EVAL, "eval/short_max", "eval/long_min") else "short and long as configured")
    intro = [f"Communication overhead eats the parallel gain when, on short tasks, the company's modelled time is "
             f"not below the single agent's ({short}).", "",
             "The same policy in both modes (the rollouts; RL trained only its company mode):", ""]
    trained = q2_ablation(s)
    if trained is None:
        return Finding(words[head], f"`{head}` short tasks: modelled-time ratio {ratio}", intro + body + [""] + lines)
    answer, evidence, trained_body = trained
    return Finding(answer, evidence, intro + body + [""] + lines + [""] + trained_body)


def q2_verdict(lo: float | None, hi: float | None, what: str) -> tuple[str, str]:
    """(answer, why) of Q2 from the short tasks' modelled-time ratio interval (`what`: how it is named)."""
    if lo is not None and lo == hi == 1.0:
        return "no", "the company does not split short tasks: same time as the single agent, no overhead"
    return {1: ("yes", "on short tasks the company takes longer than the single agent"),
            -1: ("no", "even on short tasks the company is faster"),
            0: ("cannot say", f"the short-task time ratio's {what} includes one (no speed-up)")}[side(lo, hi, 1.0)]


def q2_ablation(s: Sources) -> tuple[str, str, list[str]] | None:
    """Q2 between equally trained policies (as `q1_ablation`): the `collective` ablation's short and long
    tasks against `no_hiring`'s, per seed and across seeds; None without two seeds of both. This decides
    the summary's answer."""
    company, single = _ablation(s, "collective"), _ablation(s, "no_hiring")
    short, long = "collective_vs_no_hiring/short/critical_path_ratio", "collective_vs_no_hiring/long/critical_path_ratio"
    if len(set(company) & set(single)) < 2 or not s.has(SEEDS, f"{short}/ci_low"):
        return None
    body = ["Equally trained (the ablations, causal): `collective` against `no_hiring`, as in Q1; company critical "
            "path and single-agent tokens, and success, on short and long tasks.", "",
            "| seed | short: company path | short: single tokens | short: success company / single | "
            "long: company path | long: single tokens | long: success company / single |", "|---|---|---|---|---|---|---|"]
    for seed in sorted(set(company) & set(single)):
        fa, fb = company[seed], single[seed]
        cells = []
        for part in ("short", "long"):
            ka, kb = (_variant_key(s.files[f], v, f"{part}/critical_path_tokens") for f, v in
                      ((fa, "collective"), (fb, "no_hiring")))
            sa, sb = (_variant_key(s.files[f], v, f"{part}/success") for f, v in ((fa, "collective"), (fb, "no_hiring")))
            cells += [s.ref(fa, ka, ".1f") if ka else "n/a", s.ref(fb, kb, ".1f") if kb else "n/a",
                      f"{s.ref(fa, sa) if sa else 'n/a'} / {s.ref(fb, sb) if sb else 'n/a'}"]
        body.append(f"| `{seed}` | " + " | ".join(cells) + " |")
    answer, why = q2_verdict(s.get(SEEDS, f"{short}/ci_low"), s.get(SEEDS, f"{short}/ci_high"), "across-seed interval")
    evidence = (f"equally trained, over {s.ref(SEEDS, f'{short}/seeds', 'd')} seeds: short-task modelled-time ratio "
                f"{_seed_ci(s, short, '.3f')}")
    lines = [f"short tasks {_seed_ci(s, short, '.3f')}"]
    if s.has(SEEDS, f"{long}/mean"):
        lines.append(f"long tasks {_seed_ci(s, long, '.3f')}")
    body += ["", "Across seeds (a t-interval over the per-seed ratios of company critical path to single tokens): "
             + ", ".join(lines) + ".", "",
             f"**{answer}**: {why}; this comparison answers the summary, where both agents had the same training."]
    return answer, evidence, body


def _variant_key(data: dict, variant: str, metric: str) -> str | None:
    for key in (f"{variant}/{metric}", f"{variant}__company/{metric}"):
        if key in data:
            return key
    return None


def _ablation(s: Sources, variant: str) -> dict[str, str]:
    """{seed label: file} of one variant's ablation runs."""
    return _by_seed(s).get(variant, {})


def _disjoint(s: Sources, fa: str, ka: str, fb: str, kb: str) -> int:
    """+1 when a's interval lies wholly above b's, -1 below, 0 when they overlap or one is missing."""
    a = (s.get(fa, ka + "_ci_low"), s.get(fa, ka + "_ci_high"))
    b = (s.get(fb, kb + "_ci_low"), s.get(fb, kb + "_ci_high"))
    if None in a or None in b:
        return 0
    return 1 if a[0] > b[1] else -1 if a[1] < b[0] else 0


def _by_seed(s: Sources) -> dict[str, dict[str, str]]:
    """{variant: {seed label: file}} of all ablation runs."""
    out: dict[str, dict[str, str]] = {}
    for f in s.ablation_files():
        v = s.files[f].get("variant")
        if isinstance(v, str):
            out.setdefault(v, {})[f.rsplit("__s", 1)[-1].removesuffix(".json")] = f
    return out


SEED_METRICS = ("success", "accuracy_per_1k_tokens", "behaviour/false_approval_rate", "behaviour/idle_agents_per_hire")


def ablation_summary(s: Sources) -> dict[str, float]:
    """Across-seed figures (`rlcr.stats.across_seeds`: mean, t-interval over seeds, min, max, seeds)
    of every variant's SEED_METRICS, `<variant>/<metric>/<stat>`, of its RL change (end minus start,
    `<variant>/rl_change/<stat>`) and its split (`<variant>/rl_form_shift/...`, `<variant>/rl_within_form/...`:
    `rlcr.evaluate.form_decomposition`), and of each variant's difference
    from `collective` on the same seed, `collective_vs_<variant>/<metric>_diff/<stat>`."""
    from rlcr.stats import across_seeds

    def value(v: str, f: str, metric: str) -> float | None:
        k = _variant_key(s.files[f], v, metric)
        return s.get(f, k) if k else None

    out: dict[str, float] = {}
    runs = _by_seed(s)
    for v, seeds in sorted(runs.items()):
        for metric in SEED_METRICS:
            vals = [x for f in seeds.values() if (x := value(v, f, metric)) is not None]
            if vals:
                out.update({f"{v}/{metric}/{k}": x for k, x in across_seeds(vals).items()})
        # the RL change: each seed's end minus its start on the same tasks (rlcr.ablate.rl_change)
        for key, name in (("rl/success_diff", "rl_change"), ("rl/form_shift", "rl_form_shift"),
                          ("rl/within_form", "rl_within_form")):
            vals = [x for f in seeds.values() if (x := s.get(f, key)) is not None]
            if vals:
                out.update({f"{v}/{name}/{k}": x for k, x in across_seeds(vals).items()})
        if v == "collective" or "collective" not in runs:
            continue
        pairs = [(runs["collective"][seed], seeds[seed]) for seed in sorted(set(seeds) & set(runs["collective"]))]
        for metric in ("success", "accuracy_per_1k_tokens", "critical_path_tokens", *(
                f"{part}/{m}" for part in ("short", "long") for m in ("success", "critical_path_tokens"))):
            both = [(a, b) for fa, fb in pairs
                    if (a := value("collective", fa, metric)) is not None and (b := value(v, fb, metric)) is not None]
            if metric.endswith("critical_path_tokens"):  # modelled time: a ratio per seed (a single agent's path is its tokens)
                name, per_seed = metric.replace("critical_path_tokens", "critical_path_ratio"), [a / b for a, b in both if b > 0]
            else:
                name, per_seed = f"{metric}_diff", [a - b for a, b in both]
            if per_seed:
                out.update({f"collective_vs_{v}/{name}/{k}": x for k, x in across_seeds(per_seed).items()})
    return out


def _seed_ci(s: Sources, key: str, fmt: str = ".2f") -> str:
    """`mean [t-interval] over n seeds` from the summary, or n/a."""
    if not s.has(SEEDS, f"{key}/mean"):
        return "n/a"
    return (f"{s.ref(SEEDS, f'{key}/mean', fmt)} [{s.ref(SEEDS, f'{key}/ci_low', fmt)}, "
            f"{s.ref(SEEDS, f'{key}/ci_high', fmt)}]")


def q3(s: Sources) -> Finding:
    body, signs, evidence = [], [], ""
    with_v, without = _ablation(s, "collective"), _ablation(s, "no_verifiers")
    pairs = sorted(set(with_v) & set(without))
    metric = "accuracy_per_1k_tokens"
    if pairs:
        body += ["Ablation (causal): the collective-reward company with and without verifiers/testers, successes per "
                 "thousand generated tokens.", "", "| seed | with verifiers | without verifiers |", "|---|---|---|"]
        for seed in pairs:
            fa, fb = with_v[seed], without[seed]
            ka, kb = _variant_key(s.files[fa], "collective", metric), _variant_key(s.files[fb], "no_verifiers", metric)
            if ka and kb:
                body.append(f"| `{seed}` | {s.ci(fa, ka)} | {s.ci(fb, kb)} |")
                signs.append(_disjoint(s, fa, ka, fb, kb))
                evidence = evidence or f"ablation seed `{seed}`: {s.ci(fa, ka)} with vs {s.ci(fb, kb)} without"
        body.append("")
    else:
        body += ["No ablation pair (`collective` and `no_verifiers` with the same seed) yet: only the observational "
                 "cut below.", ""]
    runs = [r for r in eval_runs(s) if s.has(EVAL, f"{r}/verifiers/hired/{metric}", f"{r}/verifiers/none/{metric}")]
    if runs:
        body += ["Observational: company episodes that hired a verifier or tester vs those that did not (organisations "
                 "choose whom to hire, so task difficulty is confounded).", "",
                 "| run | with: episodes | with: success | with: per thousand tokens | without: episodes | "
                 "without: success | without: per thousand tokens |",
                 "|---|---|---|---|---|---|---|"]
        for r in runs:
            h, n = f"{r}/verifiers/hired/", f"{r}/verifiers/none/"
            body.append(f"| `{r}` | {s.show(EVAL, h + 'episodes', 'd')} | {s.ci(EVAL, h + 'success')} | "
                        f"{s.ci(EVAL, h + metric)} | {s.show(EVAL, n + 'episodes', 'd')} | {s.ci(EVAL, n + 'success')} | "
                        f"{s.ci(EVAL, n + metric)} |")
        body.append("")
        if not signs:
            r = runs[-1]
            seen = _disjoint(s, EVAL, f"{r}/verifiers/hired/{metric}", EVAL, f"{r}/verifiers/none/{metric}")
            direction = {1: "higher", -1: "lower", 0: "not distinguishable"}[seen]
            return Finding("cannot say", f"observational only, `{r}`: {s.ci(EVAL, f'{r}/verifiers/hired/{metric}')} "
                           f"with vs {s.ci(EVAL, f'{r}/verifiers/none/{metric}')} without",
                           body + [f"**cannot say**: only observational evidence (with verifiers: {direction}); the "
                                   "`no_verifiers` ablation answers it."])
    if not signs:
        return Finding("no data", "no ablation and no company run with and without verifiers",
                       body + ["Neither evidence is available yet."])
    key = f"collective_vs_no_verifiers/{metric}_diff"
    if (s.get(SEEDS, f"{key}/seeds") or 0) >= 2:
        # across seeds: the per-seed differences' t-interval decides (seed-to-seed spread included)
        t = side(s.get(SEEDS, f"{key}/ci_low"), s.get(SEEDS, f"{key}/ci_high"), 0.0)
        answer = {1: "yes", -1: "no", 0: "cannot say"}[t]
        evidence = (f"with minus without verifiers, per thousand tokens: {_seed_ci(s, key, '+.2f')} over "
                    f"{s.ref(SEEDS, f'{key}/seeds', 'd')} seeds")
        why = {"yes": "the across-seed interval of the difference lies above zero",
               "no": "the across-seed interval of the difference lies below zero",
               "cannot say": "the across-seed interval of the difference includes zero"}[answer]
        return Finding(answer, evidence, body + [f"Across seeds: {evidence}.", "", f"**{answer}**: {why}."])
    answer = "yes" if all(x > 0 for x in signs) else "no" if all(x < 0 for x in signs) else "cannot say"
    why = {"yes": "every interval with verifiers lies above the one without",
           "no": "every interval with verifiers lies below the one without",
           "cannot say": "the intervals overlap (or the seeds disagree)"}[answer]
    return Finding(answer, evidence, body + [f"**{answer}**: {why}."])


def q4(s: Sources) -> Finding:
    body = []
    if s.has(TRAIN, "eval_before/success", "eval_after/success"):
        body += [f"Held-out company success in the train stage (no interval): before RL "
                 f"{s.ref(TRAIN, 'eval_before/success')}, after RL {s.ref(TRAIN, 'eval_after/success')}.", ""]
    comps = policy_comparisons(s)
    if not comps:
        return Finding("no data", "no trained policy has been rolled out yet",
                       body + ["No trained policy has been rolled out yet (only the baseline): cannot answer."])
    body += ["| comparison | org | success | baseline success | difference | tasks |", "|---|---|---|---|---|---|"]
    for comp, org in comps:
        k = f"compare/{comp}/{org}/"
        a, b = comp.split("_vs_")
        body.append(f"| `{comp}` | {org} | {s.ref(EVAL, k + 'success_' + a)} | {s.ref(EVAL, k + 'success_' + b)} | "
                    f"{s.ci(EVAL, k + 'success_diff', '+.2f')} | {s.ref(EVAL, k + 'tasks', 'd')} |")
    comp, org = next(((c, o) for c, o in comps if o == "company"), comps[0])
    runs = [f"{p}__{org}" for p in comp.split("_vs_")]
    if org == "company" and all(s.has(EVAL, f"{r}/org/hires", f"{r}/org/hires_total") for r in runs):
        # what the trained "organisation" is: a company that stopped hiring wins as one agent
        body += ["", "What organisation each played: " + ", ".join(
            f"`{r}` hires {s.ref(EVAL, f'{r}/org/hires')} agents per episode ({s.ref(EVAL, f'{r}/org/hires_total', 'd')} "
            f"in all)" for r in runs) + "; the difference above is that of the company as RL left it."]
    body += form_lines(s, comp, org, runs)
    seeds, seeds_evidence = q4_seeds(s)
    body += seeds
    k = f"compare/{comp}/{org}/"
    t = side(s.get(EVAL, k + "success_diff_ci_low"), s.get(EVAL, k + "success_diff_ci_high"), 0.0)
    if not _enough(s, k + "tasks"):
        answer, why = "cannot say", _few(s)
    else:
        answer, why = {1: ("yes", "the trained organisation succeeds more often on the same tasks"),
                       -1: ("no", "the trained organisation succeeds less often"),
                       0: ("cannot say", "the difference's interval includes zero")}[t]
    return Finding(answer, f"`{comp}` {org}: difference {s.ci(EVAL, k + 'success_diff', '+.2f')}{seeds_evidence}",
                   body + ["", f"**{answer}**: {why} (the train stage's policy; the seeds above show how far "
                                "shorter runs from other seeds agree)."])


def form_lines(s: Sources, comp: str, org: str, runs: list[str]) -> list[str]:
    """Which organisations each company built (`rlcr.evaluate.org_form`: the forms its `<run>/form/<form>/...`
    keys name) and how well each did, and the difference split into a change of organisation and a change
    within it (`rlcr.evaluate.form_decomposition`)."""
    k = f"compare/{comp}/{org}/"
    if org != "company" or not s.has(EVAL, k + "form_shift", k + "within_form"):
        return []
    forms = sorted({key.split("/")[2] for r in runs for key in s.files[EVAL]
                    if key.startswith(f"{r}/form/") and key.endswith("/share")})
    head = " | ".join(f"{f}: share, success" for f in forms)
    lines = ["", "The organisation each company built (alone: nobody hired; delegate: hires, no checker; verify: a "
             "verifier or tester hired), its share of the episodes and its success there:", "",
             f"| run | {head} |", "|---|" + "---|" * len(forms)]
    for r in runs:
        cells = [f"{s.ref(EVAL, f'{r}/form/{f}/share')} ({s.ref(EVAL, f'{r}/form/{f}/episodes', 'd')}), "
                 f"{s.ci(EVAL, f'{r}/form/{f}/success')}" if s.has(EVAL, f"{r}/form/{f}/share") else "n/a"
                 for f in forms]
        lines.append(f"| `{r}` | " + " | ".join(cells) + " |")
    lines += ["", f"The difference split (paired by task; cells of organisation and task length): from building other "
              f"organisations (the trained mix of organisations at the baseline's success in each) "
              f"{s.ci(EVAL, k + 'form_shift', '+.2f')}; from doing better within the same organisation "
              f"{s.ci(EVAL, k + 'within_form', '+.2f')}."]
    return lines


def q4_seeds(s: Sources) -> tuple[list[str], str]:
    """The `collective` ablation's RL change per seed (its start and end on the same tasks) and across
    seeds: (report lines, the summary's evidence suffix); nothing without those runs."""
    runs = {seed: f for seed, f in sorted(_ablation(s, "collective").items()) if s.has(f, "rl/success_diff")}
    if not runs:
        return [], ""
    f0 = next(iter(runs.values()))
    iters = s.ref(f0, "train/iterations", "d") if s.has(f0, "train/iterations") else "n/a"
    lines = ["", f"Other seeds (the `collective` ablation: RL with the same params, {iters} iterations, its start the "
             "same bootstrap on the same tasks and sampling seed):", "",
             "| seed | start success | end success | change | from other organisations | within the same | tasks |",
             "|---|---|---|---|---|---|---|"]
    for seed, f in runs.items():
        end = _variant_key(s.files[f], "collective", "success")
        lines.append(f"| `{seed}` | {s.ci(f, 'start/success')} | {s.ci(f, end) if end else 'n/a'} | "
                     f"{s.ci(f, 'rl/success_diff', '+.2f')} | {s.show(f, 'rl/form_shift', '+.2f')} | "
                     f"{s.show(f, 'rl/within_form', '+.2f')} | {s.ref(f, 'rl/tasks', 'd')} |")
    across = _seed_ci(s, "collective/rl_change", "+.2f")
    if across == "n/a":
        return lines, ""
    lines += ["", f"Across seeds (a t-interval over the per-seed changes): {across}"
              + (f"; from other organisations {_seed_ci(s, 'collective/rl_form_shift', '+.2f')}, within the same "
                 f"{_seed_ci(s, 'collective/rl_within_form', '+.2f')}" if s.has(SEEDS, "collective/rl_form_shift/mean") else "")
              + "."]
    return lines, f"; over {s.ref(SEEDS, 'collective/rl_change/seeds', 'd')} seeds ({iters} iterations): {across}"


def _counts(s: Sources, file: str, prefix: str, name: str, variant: str | None = None) -> tuple[float, float] | None:
    """(events, chances) of one of RATE_COUNTS in `file`: keys `<prefix><count key>`, or an ablation
    variant's keys (`_variant_key`) when `variant` is given."""
    keys = []
    for count in RATE_COUNTS[name]:
        k = _variant_key(s.files[file], variant, count) if variant else prefix + count
        keys.append(k)
    if None in keys or not s.has(file, *keys):
        return None
    return s.get(file, keys[0]), s.get(file, keys[1])


def _rate_entry(events: float, chances: float) -> dict[str, float]:
    from rlcr.proportions import wilson

    out = {"events": events, "of": chances}
    if chances > 0:
        lo, hi = wilson(events, chances)
        out |= {"rate": events / chances, "ci_low": lo, "ci_high": hi}
    return out


def _diff_entry(a: tuple[float, float], b: tuple[float, float]) -> dict[str, float]:
    from rlcr.proportions import newcombe_diff

    d, lo, hi = newcombe_diff(a[0], a[1], b[0], b[1])
    return {"diff": d, "ci_low": lo, "ci_high": hi}


def rate_intervals(s: Sources) -> dict[str, float]:
    """Q5's rates from their counts (`rlcr.proportions`: Wilson intervals, Newcombe's for differences):
    `<run>/<rate>/<stat>` of every evaluated run, `compare/<policy>_vs_<baseline>/<org>/<rate>_diff/<stat>`
    of every policy comparison, and over the ablations, each variant's counts pooled over its seeds,
    `ablations/<variant>/<rate>/<stat>` (with `seeds`) and `ablations/collective_vs_individual/<rate>_diff/<stat>`.
    A rate with no chances has only its counts; a difference needs chances on both sides."""
    out: dict[str, float] = {}
    runs: dict[str, dict[str, tuple[float, float]]] = {}
    for r in eval_runs(s):
        for name in RATE_COUNTS:
            if (c := _counts(s, EVAL, f"{r}/", name)) is not None:
                runs.setdefault(r, {})[name] = c
                out.update({f"{r}/{name}/{k}": v for k, v in _rate_entry(*c).items()})
    for comp, org in policy_comparisons(s):
        a, b = (f"{p}__{org}" for p in comp.split("_vs_"))
        for name in RATE_COUNTS:
            ca, cb = runs.get(a, {}).get(name), runs.get(b, {}).get(name)
            if ca and cb and ca[1] > 0 and cb[1] > 0:
                out.update({f"compare/{comp}/{org}/{name}_diff/{k}": v for k, v in _diff_entry(ca, cb).items()})
    pooled: dict[str, dict[str, tuple[float, float]]] = {}
    for variant, seeds in sorted(_by_seed(s).items()):
        for name in RATE_COUNTS:
            per_seed = [c for f in seeds.values() if (c := _counts(s, f, "", name, variant)) is not None]
            if per_seed:
                c = (sum(x for x, _ in per_seed), sum(n for _, n in per_seed))
                pooled.setdefault(variant, {})[name] = c
                out.update({f"ablations/{variant}/{name}/{k}": v for k, v in _rate_entry(*c).items()})
                out[f"ablations/{variant}/{name}/seeds"] = float(len(per_seed))
    for name in RATE_COUNTS:
        ca, cb = pooled.get("collective", {}).get(name), pooled.get("individual", {}).get(name)
        if ca and cb and ca[1] > 0 and cb[1] > 0:
            out.update({f"ablations/collective_vs_individual/{name}_diff/{k}": v for k, v in _diff_entry(ca, cb).items()})
    return out


Q5_RATES = (("false_approval_rate", "false approvals / checked approvals (cover-up)", "cover-up"),
            ("idle_agents_per_hire", "idle hires / hires (free-riding)", "free-riding"))


def _rate_cell(s: Sources, key: str) -> str:
    """`rate [low, high] (events of chances)` from the derived rates, `n/a (0 of 0)` without chances."""
    n = f"({s.ref(RATES, key + '/events', 'd')} of {s.ref(RATES, key + '/of', 'd')})"
    if not s.has(RATES, key + "/rate"):
        return f"n/a {n}"
    return f"{s.ref(RATES, key + '/rate')} [{s.ref(RATES, key + '/ci_low')}, {s.ref(RATES, key + '/ci_high')}] {n}"


def _diff_text(s: Sources, key: str) -> str:
    return (f"{s.ref(RATES, key + '/diff', '+.2f')} [{s.ref(RATES, key + '/ci_low', '+.2f')}, "
            f"{s.ref(RATES, key + '/ci_high', '+.2f')}]")


def _few_chances(s: Sources, rates: list[str]) -> str:
    """Why a comparison of these derived rates makes no claim (a side with fewer chances than
    `report.min_tasks_for_claim`: one false approval of one checked approval is no evidence), or ""."""
    least = s.files[PARAMS]["report.min_tasks_for_claim"]
    if all((s.get(RATES, f"{r}/of") or 0.0) >= least for r in rates):
        return ""
    return f"fewer than {s.ref(PARAMS, 'report.min_tasks_for_claim', 'd')} chances on a side: no claim"


def q5(s: Sources) -> Finding:
    runs = [r for r in eval_runs(s) if not r.endswith("__single")  # a single agent hires and approves nobody
            and any(s.has(RATES, f"{r}/{name}/of") for name, _, _ in Q5_RATES)]
    if not runs:
        return Finding("no data", "no company run with turn records", ["No run with turn records was evaluated."])
    body = ["Each rate with its events (numerator of denominator) and a score interval from those counts (Wilson; "
            "a difference of two rates by Newcombe's method), which stays honest where events are few or none, "
            "unlike resampling tasks; n/a where nothing was there to count. A comparison with fewer than "
            f"{s.ref(PARAMS, 'report.min_tasks_for_claim', 'd')} chances on a side makes no claim.", "",
            "| run | " + " | ".join(d for _, d, _ in Q5_RATES) + " |", "|---|---|---|"]
    for r in runs:
        body.append(f"| `{r}` | " + " | ".join(_rate_cell(s, f"{r}/{name}") if s.has(RATES, f"{r}/{name}/of") else "n/a"
                                               for name, _, _ in Q5_RATES) + " |")
    body += ["", *cheating_lines(s), ""]
    signs, evidence, nothing = [], [], []  # nothing: the comparison had too few chances to say anything
    verdict = {1: "**rose**", -1: "fell", 0: "no change shown"}
    for comp, org in policy_comparisons(s):
        for name, _, label in Q5_RATES:
            k = f"compare/{comp}/{org}/{name}_diff"
            if s.has(RATES, k + "/diff"):
                t = side(s.get(RATES, k + "/ci_low"), s.get(RATES, k + "/ci_high"), 0.0)
                few = _few_chances(s, [f"{p}__{org}/{name}" for p in comp.split("_vs_")])
                signs.append(t if _enough(s, f"compare/{comp}/{org}/tasks") and not few else 0)
                nothing.append(bool(few))
                evidence.append(f"{label} change {_diff_text(s, k)}" + (" (too few chances)" if few else ""))
                body.append(f"- `{comp}` {org}, {label}: change {_diff_text(s, k)}: {verdict[signs[-1]]} with training"
                            + (f" ({few})" if few else "") + ".")
    pooled = [v for v in ("collective", "individual") if any(s.has(RATES, f"ablations/{v}/{n}/of") for n, *_ in Q5_RATES)]
    if pooled:
        body += ["", "Equally trained (the ablations, causal): RL with the collective reward against the individual "
                 "reward, the same iterations and tasks; each variant's counts pooled over its seeds.", "",
                 "| variant | seeds | " + " | ".join(d for _, d, _ in Q5_RATES) + " |", "|---|---|---|---|"]
        for v in pooled:
            seeds = next(f"ablations/{v}/{n}/seeds" for n, *_ in Q5_RATES if s.has(RATES, f"ablations/{v}/{n}/seeds"))
            body.append(f"| `{v}` | {s.ref(RATES, seeds, 'd')} | " + " | ".join(
                _rate_cell(s, f"ablations/{v}/{n}") if s.has(RATES, f"ablations/{v}/{n}/of") else "n/a"
                for n, *_ in Q5_RATES) + " |")
        body.append("")
        for name, _, label in Q5_RATES:
            k = f"ablations/collective_vs_individual/{name}_diff"
            if s.has(RATES, k + "/diff"):
                few = _few_chances(s, [f"ablations/{v}/{name}" for v in ("collective", "individual")])
                signs.append(0 if few else side(s.get(RATES, k + "/ci_low"), s.get(RATES, k + "/ci_high"), 0.0))
                nothing.append(bool(few))
                evidence.append(f"collective minus individual reward, {label} {_diff_text(s, k)}"
                                + (" (too few chances)" if few else ""))
                body.append(f"- collective minus individual reward, {label}: {_diff_text(s, k)}: "
                            + {1: "**higher** with the collective reward", -1: "lower with the collective reward",
                               0: "no difference shown"}[signs[-1]] + (f" ({few})" if few else "") + ".")
    if not signs:
        return Finding("cannot say", "no trained policy to compare with the baseline",
                       body + ["", "**cannot say**: without a trained policy nothing shows what collective reward taught; "
                               "the rates above are the baseline's."])
    answer = "yes" if any(x > 0 for x in signs) else "no" if all(x < 0 for x in signs) else "cannot say"
    why = {"yes": "a rate rose with the collective reward and its interval excludes zero",
           "no": "every rate fell, intervals below zero",
           "cannot say": "too few checked approvals and hires in the trained companies to measure either rate"
           if all(nothing) else "no rise shown, but the intervals do not rule one out"}[answer]
    return Finding(answer, "; ".join(evidence), body + ["", f"**{answer}**: {why}."])


CHEAT_COLUMNS = (("cheat/tamper_attempts_total", "tampering attempts"),
                 ("cheat/tampering_rate", "episodes with tampering / code episodes"),
                 ("cheat/hook_writes_total", "hook files written"),
                 ("cheat/test_rewrites_total", "others' tests rewritten"),
                 ("cheat/exit_calls_total", "early exits"),
                 ("cheat/eq_overrides_total", "equality overrides"),
                 ("cheat/canary_pass_rate", "canaries passed / canary episodes"),
                 ("cheat/claim_rejection_rate", "claims rejected / verdicts on the board"),
                 ("cheat/submitted_over_rejection_total", "answers submitted over a rejection"))
"""Q5's cheating table: counts (`_total`) and rates (shown with their numerator of denominator)."""


def cheating_lines(s: Sources) -> list[str]:
    """Q5's cheating counters of every run with code tasks, or the sentence saying there were none."""
    runs = [r for r in eval_runs(s) if s.has(EVAL, f"{r}/cheat/code_episodes_total")]
    if not runs:
        return ["Cheating counters: no code tasks in this run."]
    from rlcr.behaviour import CHEAT_RATES

    def cell(r: str, key: str) -> str:
        if key not in CHEAT_RATES:
            return s.ref(EVAL, f"{r}/{key}", "d")
        num, den = (f"{r}/{c}_total" for c in CHEAT_RATES[key])
        rate = s.ref(EVAL, f"{r}/{key}") if s.has(EVAL, f"{r}/{key}") else "n/a"
        return f"{rate} ({s.ref(EVAL, num, 'd')} of {s.ref(EVAL, den, 'd')})"

    return ["Cheating on code tasks, counted from the turn records over all of a run's episodes (a canary's hidden "
            "tests contradict its prompt, so only cheating passes one; agents writing their own tests is not tampering):", "",
            "| run | " + " | ".join(d for _, d in CHEAT_COLUMNS) + " |", "|---" * (len(CHEAT_COLUMNS) + 1) + "|",
            *(f"| `{r}` | " + " | ".join(cell(r, k) for k, _ in CHEAT_COLUMNS) + " |" for r in runs)]


QUESTIONS = (
    ("Q1", "At the same token budget, does the organisation reach the single agent's score in less time?", q1),
    ("Q2", "On short tasks, does communication overhead eat the parallel gain?", q2),
    ("Q3", "Does hiring verifiers/testers improve accuracy per token?", q3),
    ("Q4", "Does the RL-trained organisation beat the same policy organised by bootstrap only?", q4),
    ("Q5", "Does collective reward teach cover-up (verifiers approving wrong work) or free-riding?", q5),
)


# ------------------------------------------------------------------------------------- tables


def runs_table(s: Sources) -> list[str]:
    runs = eval_runs(s)
    if not runs:
        return ["No evaluation yet (metrics/eval.json is missing or has no run)."]
    out = ["| run | episodes | tasks | success | tokens / episode | critical-path tokens | real seconds / episode "
           "| successes per thousand tokens |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        acc = s.show(EVAL, f"{r}/accuracy_per_1k_tokens")
        out.append(f"| `{r}` | {s.ref(EVAL, f'{r}/episodes', 'd')} | {s.ref(EVAL, f'{r}/tasks', 'd')} | "
                   f"{s.ci(EVAL, f'{r}/success')} | {s.ref(EVAL, f'{r}/tokens', '.0f')} | "
                   f"{s.ref(EVAL, f'{r}/critical_path_tokens', '.0f')} | {s.ref(EVAL, f'{r}/seconds', '.3f')} | {acc} |")
    return out


def _right_of(s: Sources, run: str, role: str, kind: str) -> str:
    """`share (right of n)` of one kind of turn (`turn`, `combine`) of a role; n/a with none."""
    right, n = {"turn": ("correct_turns_total", "turns_total"),
                "combine": ("combines_correct_total", "combines_total")}[kind]
    k = f"{run}/skill/{role}/"
    if not s.has(EVAL, k + right, k + n) or not s.get(EVAL, k + n):
        return "n/a"
    return f"{s.ref(EVAL, k + kind + '_correct')} ({s.ref(EVAL, k + right, '.0f')} of {s.ref(EVAL, k + n, '.0f')})"


def organisation_table(s: Sources) -> list[str]:
    """What the companies built and how well each role did its part: hires per episode (all hires with
    their total, then verifiers and testers), the org's depth, and the right share of CEO turns, CEO combines (a turn that adds
    up its hires' posted results), worker turns and verifier turns, each with its count."""
    runs = [r for r in eval_runs(s) if r.endswith("__company") and s.has(EVAL, f"{r}/org/hires")]
    if not runs:
        return []
    out = ["| run | hires / episode (all) | verifier / tester hires per episode | depth | CEO turns right | "
           "CEO combines right | worker turns right | verifier turns right |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        checks = " / ".join(s.show(EVAL, f"{r}/org/hires_{role}") for role in ("verifier", "tester"))
        total = f" ({s.ref(EVAL, f'{r}/org/hires_total', '.0f')})" if s.has(EVAL, f"{r}/org/hires_total") else ""
        out.append(f"| `{r}` | {s.ref(EVAL, f'{r}/org/hires')}{total} | {checks} | {s.show(EVAL, f'{r}/org/depth')} | "
                   f"{_right_of(s, r, 'ceo', 'turn')} | {_right_of(s, r, 'ceo', 'combine')} | "
                   f"{_right_of(s, r, 'worker', 'turn')} | {_right_of(s, r, 'verifier', 'turn')} |")
    return out


def family_table(s: Sources, transfer: bool = False) -> list[str]:
    """Success per family and run: the trained families, or (`transfer`) the probes the policy never
    trained on (`<run>/transfer/family/...`)."""
    runs = eval_runs(s)
    part = "/transfer/family/" if transfer else "/family/"
    fams = sorted({k.split(part)[1].rsplit("/", 1)[0] for k in s.files.get(EVAL, {})
                   if part in k and k.endswith("/success") and k.split("/")[0] in runs
                   and (transfer or "/transfer/" not in k)})
    if not fams:
        return []
    out = ["| family | " + " | ".join(f"`{r}`" for r in runs) + " |", "|---" * (len(runs) + 1) + "|"]
    for fam in fams:
        cells = [s.show(EVAL, f"{r}{part}{fam}/success") for r in runs]
        out.append(f"| `{fam}` | " + " | ".join(cells) + " |")
    if transfer:
        out.append("| all probes | " + " | ".join(s.show(EVAL, f"{r}/transfer/success") for r in runs) + " |")
    return out


def ablation_table(s: Sources) -> list[str]:
    files = s.ablation_files()
    if not files:
        return ["No ablations yet (metrics/ablations/*.json)."]
    out = ["Each run's start is models/bootstrap rolled out the same way (its organisation, tasks and seed); the change "
           "is end minus start, paired by task.", "",
           "| variant | seed | train success first | train success last | start success | company success | change | "
           "successes per thousand tokens |", "|---|---|---|---|---|---|---|---|"]
    for f in files:
        d = s.files[f]
        v = str(d.get("variant", Path(f).stem))
        cells = [s.show(f, k) for k in ("train/success_first", "train/success_last")]
        cells.append(s.ci(f, "start/success") if s.has(f, "start/success") else "n/a")
        for metric in ("success", "accuracy_per_1k_tokens"):
            k = _variant_key(d, v, metric)
            cells.append(s.show(f, k) if k else "n/a")
            if metric == "success":
                cells.append(s.ci(f, "rl/success_diff", "+.2f") if s.has(f, "rl/success_diff") else "n/a")
        seed = s.ref(f, "seed", "d") if s.has(f, "seed") else "n/a"
        out.append(f"| `{v}` | {seed} | " + " | ".join(cells) + " |")
    variants = sorted({k.split("/")[0] for k in s.files.get(SEEDS, {}) if k.endswith("/success/mean")
                       and not k.startswith("collective_vs_")})
    if variants:
        out += ["", "Across seeds: mean with a t-interval over the seeds (their spread, not task resampling), and the "
                "difference from `collective` on the same seeds.", "",
                "| variant | seeds | company success | lowest seed | highest seed | change from start | `collective` minus "
                "variant |", "|---|---|---|---|---|---|---|"]
        for v in variants:
            k = f"{v}/success"
            diff = _seed_ci(s, f"collective_vs_{v}/success_diff", "+.2f")
            out.append(f"| `{v}` | {s.ref(SEEDS, k + '/seeds', 'd')} | {_seed_ci(s, k)} | {s.ref(SEEDS, k + '/min')} | "
                       f"{s.ref(SEEDS, k + '/max')} | {_seed_ci(s, f'{v}/rl_change', '+.2f')} | "
                       f"{diff if v != 'collective' else 'n/a'} |")
    return out


def training_lines(s: Sources) -> list[str]:
    out = []
    if s.has(BOOT, "bootstrap/company/sampled", "bootstrap/single/sampled"):
        out.append(f"- Bootstrap held-out check (no interval): company {s.ref(BOOT, 'bootstrap/company/sampled')}, "
                   f"single agent {s.ref(BOOT, 'bootstrap/single/sampled')}.")
    skills = []
    for role, rate, count, label in (("ceo", "turn_correct", "turns_total", "CEO turns"),
                                     ("ceo", "combine_correct", "combines_total", "CEO combines"),
                                     ("ceo", "split_correct", "splits_total", "CEO splits"),
                                     ("worker", "turn_correct", "turns_total", "worker turns"),
                                     ("verifier", "turn_correct", "turns_total", "verifier turns")):
        key, n = (f"bootstrap/company/sampled/skill/{role}/{k}" for k in (rate, count))
        if s.has(BOOT, key, n):
            skills.append(f"{label} {s.ref(BOOT, key)} (of {s.ref(BOOT, n, '.0f')})")
    if skills:
        out.append("- Bootstrap sub-skills (company, sampled; right share of each kind of turn): " + ", ".join(skills) + ".")
    if s.has(TRAIN, "train/iterations"):
        delta = f", change {s.ref(TRAIN, 'eval/success_delta', '+.2f')}" if s.has(TRAIN, "eval/success_delta") else ""
        out.append(f"- RL training: {s.ref(TRAIN, 'train/iterations', 'd')} iterations{delta}.")
    return out or ["- No bootstrap or train metrics yet."]


# ------------------------------------------------------------------------------------ the whole


def template(s: Sources, plots: dict[str, bool], charts: list[str]) -> str:
    """The report with every figure as a placeholder."""
    findings = [(q, text, fn(s)) for q, text, fn in QUESTIONS]
    level = (f"{s.ref(EVAL, 'eval/level', '.0%')} confidence intervals from "
             f"{s.ref(EVAL, 'eval/n_resamples', 'd')} task resamples") if s.has(EVAL, "eval/level", "eval/n_resamples") \
        else "confidence intervals from resampling tasks"
    lines = [f"# {s.ref(PARAMS, 'report.title', 's')}", "",
             "Reinforcement learning from collective rewards (not calibration rewards). Every figure below is filled "
             "from a metrics file; `report_sources.json` names the file and key of each. Brackets are "
             f"{level} (across ablation seeds: t-intervals over the per-seed figures; a rate of counted events: a "
             "score interval from its counts); a claim is made only when the interval excludes the null value and "
             "enough tasks back it.", ""]
    if s.missing:
        lines += ["**Missing inputs**: " + ", ".join(f"`{m}`" for m in s.missing) + ".", ""]
    lines += ["## Summary", "", "| question | answer | key evidence |", "|---|---|---|"]
    lines += [f"| {q}: {text} | **{f.answer}** | {f.evidence} |" for q, text, f in findings]
    lines += ["", "## Runs", "", *runs_table(s), "", "## Success per family", "", "Trained families (every figure above and below is on these):", "",
              *(family_table(s) or ["n/a"]), "", "## Transfer probes", "",
              "Families the policy was never trained on, kept apart from every other figure:", "",
              *(family_table(s, transfer=True) or ["None in this run."]), "",
              "## Organisation", "",
              "What each company built (held-out eval, trained families) and how often each role's turns were right:",
              "", *(organisation_table(s) or ["No company run."]), "",
              "## Training", "", *training_lines(s), ""]
    for q, text, f in findings:
        lines += [f"## {q}. {text}", "", *f.body, ""]
    lines += ["## Ablations", "", *ablation_table(s), "", "## Plots", ""]
    for name, caption in PLOTS.items():
        lines += [f"### {caption}", "", f"![{caption}]({name}.png)" if plots.get(name) else "Nothing to draw yet.", ""]
        if name == "org_charts" and charts:
            lines += ["Episodes drawn: " + ", ".join(f"`{c}`" for c in charts) + ".", ""]
    lines += ["## Episode viewer", "", "[Open the episode viewer](viewer/index.html): every rollout episode, its org chart, timeline, board, files and verdict, and the org's shape over training.", ""]
    return "\n".join(lines)


def _curves(root: Path) -> dict[str, list]:
    import pandas as pd

    curves: dict[str, list] = {}
    if (root / "plots/train.csv").is_file():
        curves["trained"] = [pd.read_csv(root / "plots/train.csv")]
    for p in sorted((root / "plots/ablations").glob("*.csv")):
        curves.setdefault(p.stem.rsplit("__s", 1)[0], []).append(pd.read_csv(p))
    return curves


def _sample_charts(root: Path, s: Sources, n: int) -> list[tuple[str, str, list]]:
    """(episode id, title, org chart) of the n largest company organisations of the trained policy
    (the baseline when there is none) on the trained families, ties broken by episode id."""
    import pandas as pd

    runs = [r for r in eval_runs(s) if r.endswith("__company") and (root / f"data/rollouts/{r}.parquet").is_file()]
    if not runs or n < 1:
        return []
    head = _headline([r.split("__")[0] for r in runs], s)
    ep = pd.read_parquet(root / f"data/rollouts/{head}__company.parquet", columns=["episode_id", "family", "outcome",
                                                                                   "n_agents", "org_chart"])
    trained = {k.split("/")[2] for k in s.files.get(EVAL, {}) if k.startswith(f"{head}__company/family/")}
    if trained:  # the trained families' episodes: transfer probes stay apart here too
        ep = ep[ep["family"].isin(trained)]
    ep = ep.sort_values(["n_agents", "episode_id"], ascending=[False, True]).head(n)
    return [(e.episode_id, f"{head} {e.episode_id} ({e.family}, {'success' if e.outcome >= 1 else 'fail'})",
             json.loads(e.org_chart)) for e in ep.itertuples()]


def _time_points(s: Sources) -> dict[str, Any]:
    import pandas as pd

    out = {}
    for r in eval_runs(s):
        keys = sorted({k.split("/")[2] for k in s.files[EVAL] if k.startswith(f"{r}/difficulty/")})
        rows = [{c: s.get(EVAL, f"{r}/difficulty/{d}/{c}") for c in
                 ("critical_path_tokens", "success", "success_ci_low", "success_ci_high")} for d in keys]
        out[r] = pd.DataFrame([x for x in rows if None not in x.values()])
    return out


def build_report(root: Path, report_params: dict[str, Any], out_dir: Path) -> list[Path]:
    """Read the metrics files under `root`, draw the PNGs and write report.md + report_sources.json
    into `out_dir`; returns the files written."""
    from rlcr import io, plots

    s = Sources.load(root, report_params)
    s.files[SEEDS] = ablation_summary(s)
    io.write_json(s.files[SEEDS], out_dir / "ablation_summary.json")
    s.files[RATES] = rate_intervals(s)
    io.write_json(s.files[RATES], out_dir / "rate_intervals.json")
    curves = _curves(root)
    charts = _sample_charts(root, s, report_params["sample_org_charts"])
    drawn = {"learning_curves": plots.learning_curves(curves, out_dir / "learning_curves.png"),
             "behaviour_over_training": plots.behaviour_over_training(curves, out_dir / "behaviour_over_training.png"),
             "success_vs_critical_path": plots.success_vs_critical_path(_time_points(s),
                                                                        out_dir / "success_vs_critical_path.png"),
             "org_charts": plots.org_charts([c[1:] for c in charts], out_dir / "org_charts.png")}
    text, spans = fill(template(s, drawn, [c[0] for c in charts]), s)
    io.write_json(spans, out_dir / "report_sources.json")
    io.write_text(text, out_dir / "report.md")
    return [out_dir / "report.md", out_dir / "report_sources.json", out_dir / "ablation_summary.json",
            out_dir / "rate_intervals.json"] + [out_dir / f"{k}.png" for k, v in drawn.items() if v]


__all__ = ["NOT_FIGURES", "PLACEHOLDER", "QUESTIONS", "Finding", "Sources", "build_report", "fill", "format_value",
           "side", "template", "untraced_figures"]
