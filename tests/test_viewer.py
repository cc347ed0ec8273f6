"""The episode viewer (rlcr/viewer.py) driven in a real headless Chromium (Debian's, through Playwright).

Rollouts are real episodes (scripted organisations on sum tasks, plus one hand-written hostile episode)
written by the project's own rollout writer; the viewer is built by its command and opened from
file://. Screenshots go to $RLCR_VIEWER_SCREENSHOTS, else to a `viewer_screenshots` folder under
pytest's temporary directory; the test that writes them prints where.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pandas as pd
import pytest

from rlcr.behaviour import episode_metrics
from rlcr.config import OrgConfig, RewardConfig
from rlcr.org.episode import run_episodes
from rlcr.org.records import read_parquet
from rlcr.org.scripted import Replay, ScriptedOrg
from rlcr.rollout import rollout_frames, write_rollout
from rlcr.tasks import Task, build_family
from rlcr.viewer import ASSETS, describe, file_history, find_runs, js_literal, main

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
HOSTILE_RUN = "<img src=x onerror=window.__pwned=10>__company"
XSS = "<script>window.__pwned=1</script>"
IMG = '<img src=x onerror="window.__pwned=2">'


def sum_tasks(n: int, seed: int = 7) -> list[Task]:
    return [t for d in (1, 2, 3) for t in build_family("sum").generate(seed, n, d)]


def write_run(folder: Path, stem: str, records) -> None:
    write_rollout(rollout_frames(records), folder, stem)


def hostile_records():
    """One episode whose every text field is an attack: completion, brief, post, file, answer, task, id."""
    task = Task(id="t-evil", family="sum", kind="math", difficulty=1,
                prompt='What is 2+3? <img src=x onerror="window.__pwned=8">', answer="5")
    script = {
        (0, 1): f"{XSS}\n{IMG}\nHIRE worker: <b>bold</b> brief <img src=x onerror=window.__pwned=3>\n"
                "POST @agent1 <img src=x onerror=window.__pwned=4> \u202eevil\n"
                "WRITE notes/a.txt\nline one <script>window.__pwned=5</script>\nline two",
        (0, 2): "WRITE notes/a.txt\nthe ceo's version",
        (1, 2): "WRITE notes/a.txt\nline one <script>window.__pwned=5</script>\nline 2 </pre><img src=x onerror=window.__pwned=6>",
        (0, 3): "SUBMIT <img src=x onerror=window.__pwned=7>",
    }
    return run_episodes([task], Replay(script), OrgConfig(), RewardConfig(),
                        episode_ids=['ep"><img src=x onerror=window.__pwned=9>#0'])


def curves(root: Path) -> None:
    for rel, k in (("plots/train.csv", 0.0), ("plots/ablations/no_board__s1.csv", 0.5)):
        it = range(1, 6)
        frame = pd.DataFrame({"iteration": list(it), "reward_mean": [0.1 * i for i in it], "org_size": [1 + k + 0.3 * i for i in it],
                              "org_depth": [0.2 * i for i in it], "org_hires_worker": [0.5 * i for i in it],
                              "org_hires_verifier": [k * i for i in it], "behaviour_collective_thinking": [0.05 * i for i in it],
                              "losses_pg": [0.0] * 5})
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(root / rel, index=False)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("viewer")
    org, reward = OrgConfig(max_agents=8), RewardConfig()
    tasks = sum_tasks(8)
    write_run(root / "data/rollouts", "trained__company",
              run_episodes(tasks, ScriptedOrg("verify", error_rate=0.3, rubber_stamp=0.5, seed=1), org, reward))
    write_run(root / "data/rollouts", "trained__single",
              run_episodes(tasks, ScriptedOrg("solo", error_rate=0.2, seed=1), OrgConfig(single_agent=True), reward))
    write_run(root / "data/rollouts", HOSTILE_RUN, hostile_records())
    write_run(root / "ablations/no_board__s1", "rollout",
              run_episodes(tasks[:9], ScriptedOrg("delegate", error_rate=0.1, seed=2), org, reward))
    curves(root)
    assert main([str(root / "data/rollouts"), str(root / "ablations"), "--out", str(root / "viewer"),
                 "--curves", str(root / "plots/train.csv"), str(root / "plots/ablations"), "--chunk-size", "5"]) == 0
    return root


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: `make setup` installs it"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1500, "height": 1000})
    pg = ctx.new_page()
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("requestfailed", lambda r: pg.errors.append(f"request failed: {r.url}"))
    yield pg
    ctx.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("RLCR_VIEWER_SCREENSHOTS") or tmp_path_factory.mktemp("viewer_screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\n[viewer] screenshots in {folder}")
    return folder


def manifest(root: Path) -> dict:
    text = (root / "viewer/data/manifest.js").read_text()
    return json.loads(text[text.index(",") + 1: text.rindex(")")])


def open_viewer(page, root: Path, name: str = "index.html") -> None:
    page.goto((root / "viewer" / name).as_uri())
    page.wait_for_selector("body[data-ready='1']")


def open_run(page, key: str) -> None:
    page.click(f"button.run[data-run={key}]")
    page.wait_for_selector("#episode-list tr.ep")


def open_episode(page, index: int) -> None:
    page.click(f"tr.ep[data-index='{index}']")
    page.wait_for_selector("#timeline table.lanes")


def run_key(root: Path, stem: str) -> str:
    return next(r["key"] for r in manifest(root)["runs"] if r["source"].endswith(f"{stem}.parquet"))


# ------------------------------------------------------------------------------ in the browser


def test_click_through_a_run_and_an_episode_matches_the_parquet(project, page, shots):
    open_viewer(page, project)
    runs = manifest(project)["runs"]
    assert page.locator("button.run").count() == len(runs) == 4
    assert page.locator("button.run .run-label").all_text_contents() == [
        f"{HOSTILE_RUN.rpartition('__')[0]} x company", "trained x company", "trained x single", "no_board (seed 1)"]
    records = read_parquet(project / "data/rollouts/trained__company.turns.parquet",
                           project / "data/rollouts/trained__company.parquet")
    open_run(page, run_key(project, "trained__company"))
    assert page.text_content("#count") == f"{len(records)} of {len(records)} episodes"
    page.screenshot(path=shots / "1_run_list.png")
    # the largest organisation, in a later chunk than the first
    index = max(range(len(records)), key=lambda i: (records[i].episode.n_agents, i))
    rec = records[index]
    ep = rec.episode
    assert ep.n_agents >= 4 and index >= 5
    open_episode(page, index)

    # org chart: every member under its parent, with its role and brief
    org = ep.org()
    assert page.locator("#org li.member").count() == len(org)
    for m in org:
        li = page.locator(f"#org li.member[data-agent='{m['agent']}']")
        assert li.get_attribute("data-role") == m["role"]
        parent = li.locator("xpath=ancestor::li[1]")
        assert (parent.get_attribute("data-agent") if m["parent"] >= 0 else None) == (
            str(m["parent"]) if m["parent"] >= 0 else None)
        if m["brief"]:
            assert li.locator(":scope > .brief").text_content() == m["brief"]

    # timeline: one lane per agent, one column per round, each turn in its cell
    assert page.locator("#timeline tr.lane").count() == ep.n_agents
    assert page.locator("#timeline th.round-head").count() == ep.rounds
    assert page.locator("#timeline td.cell.turn").count() == ep.n_turns == len(rec.turns)
    for t in rec.turns:
        cell = page.locator(f"#timeline tr.lane[data-agent='{t.agent}'] td[data-round='{t.round}']")
        assert cell.locator("pre.completion").text_content() == t.completion
        assert cell.locator("li.action").evaluate_all("els => els.map(e => e.dataset.kind)") == [
            a["kind"] for a in t.action_list()]
        assert cell.locator("li.error").all_text_contents() == json.loads(t.errors)

    # verdict, answer, reward
    assert page.text_content("#answer") == (ep.answer if ep.submitted else "nothing submitted")
    assert page.text_content("#submitter") == (f"agent{ep.submitter}" if ep.submitter >= 0 else "nobody")
    assert page.text_content("#outcome").startswith(f"{ep.outcome:.2f}")
    assert page.text_content("#reward") == f"{ep.reward:.3f}"
    assert page.text_content("#expected") == ep.task_obj().answer
    n_posts = sum(a["kind"] == "POST" for t in rec.turns for a in t.action_list())
    assert page.locator("#board li.post").count() == n_posts
    page.screenshot(path=shots / "2_episode.png", full_page=True)
    assert "ep=" in page.url and not page.errors


def test_filters_count_what_the_metrics_count_and_sort(project, page):
    records = read_parquet(project / "data/rollouts/trained__company.turns.parquet",
                           project / "data/rollouts/trained__company.parquet")
    metrics = [episode_metrics(r) for r in records]
    open_viewer(page, project)
    open_run(page, run_key(project, "trained__company"))

    def count(box: str, expected: int) -> None:
        page.check(box)
        assert page.text_content("#count") == f"{expected} of {len(records)} episodes", box
        assert page.locator("tr.ep").count() == min(expected, 50)
        page.uncheck(box)

    count("#f-fail", sum(r.episode.outcome < 1 for r in records))
    count("#f-false", sum(m["behaviour/false_approvals"] > 0 for m in metrics))
    count("#f-idle", sum(m["behaviour/idle_agents"] > 0 for m in metrics))
    count("#f-malformed", sum(r.episode.malformed_turns > 0 for r in records))
    assert sum(m["behaviour/false_approvals"] > 0 for m in metrics) > 0  # the filter is exercised
    page.select_option("#f-difficulty", "3")
    page.fill("#f-min-rounds", "4")
    want = [i for i, r in enumerate(records) if r.episode.task_obj().difficulty == 3 and r.episode.rounds >= 4]
    assert [int(x) for x in page.locator("tr.ep").evaluate_all("els => els.map(e => e.dataset.index)")] == want
    page.select_option("#f-sort", "agents")
    agents = [int(x) for x in page.locator("tr.ep td:nth-child(7)").all_text_contents()]
    assert agents == sorted(agents, reverse=True) and len(agents) == len(want)
    assert not page.errors


def test_hostile_text_renders_as_text_and_never_runs(project, page, shots):
    open_viewer(page, project)
    open_run(page, run_key(project, HOSTILE_RUN))
    open_episode(page, 0)
    page.click("#timeline details.prompt >> nth=0")
    page.wait_for_selector("#timeline details.prompt pre")
    page.screenshot(path=shots / "3_hostile_episode.png", full_page=True)
    assert_hostile_inert(page)
    # scripts: only the app and its data files, none inline
    srcs = page.locator("script").evaluate_all("els => els.map(e => e.getAttribute('src'))")
    assert all(s == "viewer.js" or re.fullmatch(r"data/[a-z0-9]+\.js", s or "") for s in srcs), srcs


def assert_hostile_inert(page_or_frame) -> None:
    p = page_or_frame
    assert p.evaluate("window.__pwned") is None
    assert p.locator("img, b, iframe, object, embed").count() == 0
    cell = p.locator("#timeline tr.lane[data-agent='0'] td[data-round='1'] pre.completion").text_content()
    assert cell.startswith(f"{XSS}\n{IMG}\n")
    assert "<U+202E>evil" in p.locator("#board .post-text").text_content()
    assert p.locator("#org li.member[data-agent='1'] .brief").text_content().startswith("<b>bold</b> brief <img")
    assert p.text_content("#answer") == "<img src=x onerror=window.__pwned=7>"
    assert p.text_content("#task-prompt").endswith('<img src=x onerror="window.__pwned=8">')
    assert p.text_content("#episode-title") == 'ep"><img src=x onerror=window.__pwned=9>#0'
    diff = p.locator("#files .file-round[data-round='2'] pre.diff").text_content()
    assert "+line 2 </pre><img src=x onerror=window.__pwned=6>" in diff
    assert p.locator("#files .file-round[data-round='2'] .write.lost").count() == 1  # agent0 lost to agent1
    assert "window.__pwned=8" in p.locator("#timeline details.prompt pre").first.text_content()


def test_standalone_file_works_in_a_sandboxed_blob_frame_like_the_mlflow_ui(project, page):
    html = (project / "viewer/standalone.html").read_text()
    assert 'RLCR.put("' not in html and "<img" not in html  # data inline as JSON, escaped
    page.goto("about:blank")
    page.evaluate("""html => {
        const f = document.createElement('iframe');
        f.setAttribute('sandbox', 'allow-scripts');
        f.width = 1400; f.height = 900;
        f.src = URL.createObjectURL(new Blob([html], {type: 'text/html'}));
        document.body.appendChild(f);
    }""", html)
    frame = page.frame_locator("iframe")
    frame.locator("body[data-ready='1']").wait_for()
    frame.locator(f"button.run[data-run={run_key(project, HOSTILE_RUN)}]").click()
    frame.locator("tr.ep[data-index='0']").click()
    frame.locator("#timeline table.lanes").wait_for()
    frame.locator("#timeline details.prompt >> nth=0").click()
    assert_hostile_inert(page.frames[1])
    assert not page.errors


def test_curves_page_draws_one_line_per_curve_file_in_svg(project, page, shots):
    open_viewer(page, project)
    page.click("#tab-curves")
    page.wait_for_selector("#curves-page figure.chart")
    metrics = page.locator("figure.chart").evaluate_all("els => els.map(e => e.dataset.metric)")
    assert metrics == ["org_size", "org_depth", "org_hires_verifier", "org_hires_worker", "behaviour_collective_thinking",
                       "reward_mean"]  # losses_pg is not the org's shape
    size = page.locator("figure.chart[data-metric='org_size'] g.series")
    assert size.evaluate_all("els => els.map(e => e.dataset.variant + '/' + e.dataset.seed)") == ["trained/", "no_board/1"]
    points = size.nth(1).locator("polyline").get_attribute("points").split()
    ys = [float(p.split(",")[1]) for p in points]
    assert len(points) == 5 and ys == sorted(ys, reverse=True)  # org size grows: y falls on screen
    page.uncheck("#legend .legend-item[data-variant='no_board'] input")
    assert page.locator("#curves-page g.series.hidden").count() == len(metrics)
    page.screenshot(path=shots / "4_curves.png", full_page=True)
    assert not page.errors


def test_an_empty_viewer_says_so(tmp_path, page):
    assert main([str(tmp_path), "--out", str(tmp_path / "viewer")]) == 0  # a folder without rollouts
    open_viewer(page, tmp_path)
    assert page.text_content("#runs .hint") == "No rollout or ablation parquet files were given."
    page.click("#tab-curves")
    assert "No training curves" in page.text_content("#curves-page .hint") and not page.errors


def test_a_default_run_sized_viewer_pages_and_opens_fast(tmp_path, page, shots):
    """A default run rolls out 112 eval tasks per policy x org: 448 episodes. Here the same count: a
    company run of 336 episodes of verify organisations of up to 8 agents, and a single-agent run of 112."""
    tasks = sum_tasks(112)
    reward = RewardConfig()
    company = run_episodes(tasks, ScriptedOrg("verify", error_rate=0.2, rubber_stamp=0.3, seed=4), OrgConfig(max_agents=8), reward)
    write_run(tmp_path / "rollouts", "trained__company", company)
    write_run(tmp_path / "rollouts", "trained__single",
              run_episodes(tasks[:112], ScriptedOrg("solo", seed=4), OrgConfig(single_agent=True), reward))
    t0 = time.perf_counter()
    assert main([str(tmp_path / "rollouts"), "--out", str(tmp_path / "viewer")]) == 0
    build = time.perf_counter() - t0
    turns = sum(len(r.turns) for r in company)
    t0 = time.perf_counter()
    open_viewer(page, tmp_path)
    opened = time.perf_counter() - t0
    t0 = time.perf_counter()
    open_run(page, "r0")
    listed = time.perf_counter() - t0
    assert page.text_content("#count") == f"{len(company)} of {len(company)} episodes"
    page.click("#next")
    page.wait_for_selector("tr.ep[data-index='50']")
    index = max(range(len(company)), key=lambda i: (company[i].episode.n_turns, -i))
    page.fill("#f-search", company[index].episode.episode_id)
    t0 = time.perf_counter()
    open_episode(page, index)
    shown = time.perf_counter() - t0
    assert page.locator("#timeline td.cell.turn").count() == company[index].episode.n_turns
    page.screenshot(path=shots / "5_default_sized_episode.png", full_page=True)
    t0 = time.perf_counter()
    open_viewer(page, tmp_path, "standalone.html")  # every episode inline, as the MLflow UI gets it
    whole = time.perf_counter() - t0
    mb = (tmp_path / "viewer/standalone.html").stat().st_size / 1e6
    print(f"\n[viewer] {len(company)} + {len(tasks[:112])} episodes, {turns} company turns: build {build:.2f} s, "
          f"open {opened:.2f} s, run list {listed:.2f} s, episode of {company[index].episode.n_turns} turns {shown:.2f} s; "
          f"standalone.html ({mb:.1f} MB) open {whole:.2f} s")
    assert max(opened, listed, shown, whole) < 10  # generous: 2 shared cores; the figures are printed
    assert not page.errors


# ----------------------------------------------------------------------------------- pure parts


def test_viewer_code_never_parses_data_as_html():
    app = (ASSETS / "viewer.js").read_text()
    code = re.sub(r"/\*.*?\*/", "", app, flags=re.S)
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "setAttribute(\"style", ".href", "srcdoc"):
        assert sink not in code, sink


def test_js_literal_cannot_end_a_script_or_a_string():
    text = js_literal({"c": "</script><script>x()</script>\u2028\u2029&\"'\\"})
    assert not set(text) & set("<>&\u2028\u2029") and text.isascii()
    assert json.loads(text) == {"c": "</script><script>x()</script>\u2028\u2029&\"'\\"}


def test_runs_are_found_and_labelled_from_their_paths(project):
    runs = find_runs([project / "data/rollouts/trained__single.turns.parquet", project])
    labels = [(r.kind, r.label, r.stem) for r in runs]
    assert labels[0] == ("rollout", "trained x single", "trained__single")
    assert ("ablation", "no_board (seed 1)", "rollout") in labels and len(labels) == 4  # each run once
    assert describe(Path("x/odd.parquet")).label == "odd"
    start = describe(Path("ablations/no_board__s1/start.parquet"))  # an ablation's start policy, same tasks
    assert (start.kind, start.variant, start.seed, start.label) == ("ablation", "no_board", 1,
                                                                    "no_board (seed 1), its start (bootstrap)")
    with pytest.raises(FileNotFoundError):
        find_runs([project / "plots/train.csv"])


def test_file_history_replays_the_workspace_rules():
    (rec,) = hostile_records()
    writes = file_history(rec.turns)
    assert [(w["round"], w["agent"], w["won"], w["version"]) for w in writes] == [(1, 0, True, 1), (2, 0, False, None),
                                                                                 (2, 1, True, 2)]
    assert writes[0]["diff"] == ["@@ -0,0 +1,2 @@", "+line one <script>window.__pwned=5</script>", "+line two"]
    assert writes[2]["diff"][0].startswith("@@") and "-line two" in writes[2]["diff"]


def test_report_stage_writes_logs_and_links_the_viewer(project):
    import sys

    from rlcr.config import load_params

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stages"))
    import report as stage  # stages/report.py

    logged = []

    class Tracker:
        run_id = None

        def log_artifact(self, path, artifact_path=None):
            logged.append((Path(path), artifact_path))

        def log_text(self, text, artifact_file):
            logged.append((text, artifact_file))

    params = load_params(Path(__file__).resolve().parents[1] / "params.yaml", {"tracking.enabled": False})
    stage.body(params, Tracker(), project)
    html = [text for text, name in logged if name == "report/report.html"]
    assert len(html) == 1 and "<table>" in html[0] and "data:image/png;base64," in html[0]
    viewer = project / "reports/viewer"
    assert (viewer / "index.html").is_file() and (viewer / "standalone.html").is_file()
    assert (viewer, "viewer") in logged
    assert "](viewer/index.html)" in (project / "reports/report.md").read_text()
    assert [r["label"] for r in manifest(project / "reports")["runs"]][-1] == "no_board (seed 1)"
