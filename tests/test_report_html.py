"""The HTML report (`harness report`): its numbers are the result files' and the
leaderboard's, it is the same bytes for the same results, and in a real browser (headless
Chromium through selenium) every page loads without console errors, every image decodes,
every local link and anchor resolves, and a click on a column header sorts the rows.

The browser tests skip, saying why, where selenium, chromium or chromedriver is missing
(`.ci/run` installs Debian's chromium and chromium-driver where apt-get is available).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import types
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from harness.cli import main
from harness.core import HarnessError, load_methods
from harness.records import read_result
from harness.report import write_leaderboard, write_report
from harness.report.run_page import NO_EMBEDDINGS

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO / "results" / "reference"
METHODS = ("contrastive", "multi_similarity", "triplet")
SAVED = "triplet"  # the method whose seed 0 "saved its embeddings" (a fake drawer draws)


def _results(root: Path, methods=METHODS, cost: bool = True) -> Path:
    """A results folder with copies of the committed default runs of `methods` (3 seeds
    each) and the committed cost record."""
    for method in methods:
        shutil.copytree(REFERENCE / "runs" / "default" / method,
                        root / "runs" / "default" / method)  # fmt: skip
    if cost:
        (root / "cost").mkdir(parents=True)
        shutil.copyfile(REFERENCE / "cost" / "default.json", root / "cost" / "default.json")
    return root


def _fake_retrieval(calls: list) -> types.ModuleType:
    """A stand-in for harness.report.retrieval: a small PNG for a folder with no real
    embeddings in it (the real drawer: test_a_saved_run_shows_its_real_retrieval_grid)."""
    module = types.ModuleType("harness.report.retrieval")

    def draw_retrieval_grid(folder: Path, out_png: Path, **options) -> Path:
        from PIL import Image

        calls.append((Path(folder), Path(out_png)))
        Image.new("RGB", (64, 32), (200, 30, 30)).save(out_png)
        return Path(out_png)

    module.draw_retrieval_grid = draw_retrieval_grid
    return module


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, Path, list]:
    """(results folder, its report's index.html, the fake drawer's calls)."""
    load_methods()
    results = _results(tmp_path_factory.mktemp("small") / "results")
    (results / "runs" / "default" / SAVED / "seed0.embeddings").mkdir()
    calls: list = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "harness.report.retrieval", _fake_retrieval(calls))
        index = write_report(results)
    return results, index, calls


class _Tables(HTMLParser):
    """Every table of a page: {id or position: [[cell text, ...], ...]} (header row first)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._rows: list[list[str]] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._rows = self.tables.setdefault(dict(attrs).get("id") or str(len(self.tables)), [])
        elif tag == "tr" and self._rows is not None:
            self._rows.append([])
        elif tag in ("td", "th") and self._rows is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._rows:
            self._rows[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._rows = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _tables(page: Path) -> dict[str, list[list[str]]]:
    parser = _Tables()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.tables


def _main_table(index: Path) -> list[list[str]]:
    return next(t for name, t in _tables(index).items() if name.startswith("table-protocol-"))


def _markdown_rows(board: str) -> list[list[str]]:
    """The first markdown table under the default protocol's heading in LEADERBOARD.md."""
    part = board.split("\n## default (protocol", 1)[1]
    block = []
    for line in part.splitlines():
        if line.startswith("|"):
            block.append(line)
        elif block:
            break
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in block]
    return [rows[0], *[r for r in rows[1:] if not set("".join(r)) <= set("-:")]]


def test_the_report_shows_the_numbers_of_the_result_files_and_the_leaderboard(small):
    results, index, _ = small
    table = _main_table(index)
    header, rows = table[0], {row[0]: row for row in table[1:]}
    assert set(rows) == set(METHODS)
    for method in METHODS:
        values = [read_result(results / "runs" / "default" / method / f"seed{s}.json")
                  .metrics["map@r"] for s in range(3)]  # fmt: skip
        cell = rows[method][header.index("map@r (%)")]
        assert cell.startswith(f"{100 * sum(values) / len(values):.1f} ± "), (method, cell)
    board = write_leaderboard(results).read_text(encoding="utf-8")
    assert table == _markdown_rows(board)  # every cell, mark and interval, in the same order


def test_each_method_has_a_page_with_its_figures_and_provenance(small):
    results, index, calls = small
    text = index.read_text(encoding="utf-8")
    for method in METHODS:
        assert f'href="default/{method}.html"' in text
        page = (index.parent / "default" / f"{method}.html").read_text(encoding="utf-8")
        assert f"../assets/default/{method}_training.png" in page
        assert f"../assets/default/{method}_distances.png" in page
        record = read_result(results / "runs" / "default" / method / "seed1.json")
        assert record.environment.git_commit in page
        assert record.protocol.hash in page and record.started_at in page
        assert (NO_EMBEDDINGS in page) == (method != SAVED)
    # drawn while the report is built in a folder beside it, then moved into place
    assert [(folder, png.name) for folder, png in calls] == [
        (results / "runs" / "default" / SAVED / "seed0.embeddings", f"{SAVED}_retrieval_seed0.png")
    ]
    assert (index.parent / "assets" / "default" / f"{SAVED}_retrieval_seed0.png").is_file()
    saved = (index.parent / "default" / f"{SAVED}.html").read_text(encoding="utf-8")
    assert f'<img src="../assets/default/{SAVED}_retrieval_seed0.png"' in saved
    cost = (index.parent / "cost.html").read_text(encoding="utf-8")
    assert 'src="assets/cost_default.png"' in cost and "mining ms" in cost


@pytest.fixture(scope="module")
def two_protocols(tmp_path_factory) -> Path:
    """The report of the committed default and omniglot runs of METHODS: enough for the
    critical-difference diagram and the bump chart (two protocols, three shared methods)."""
    from canned_posteriors import canned_compare

    load_methods()
    results = _results(tmp_path_factory.mktemp("two") / "results", cost=False)
    for method in METHODS:
        shutil.copytree(REFERENCE / "runs" / "omniglot" / method,
                        results / "runs" / "omniglot" / method)  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:  # the page, not the model: no sampling
        mp.setattr("harness.stats.hierarchical.compare", canned_compare)
        return write_report(results)


def test_the_front_page_opens_with_the_figures_at_a_glance(two_protocols):
    """First the critical-difference diagram, beside it the stacked bars of practical
    equivalence, then the bump chart, then each protocol's forest plot linking to its table;
    the tables' definitions behind a fold."""
    text = two_protocols.read_text(encoding="utf-8")
    images = re.findall(r'<img src="([^"]+)"', text)
    assert images[:5] == ["assets/glance/cd_diagram.png", "assets/glance/equivalence.png",
                          "assets/glance/ranks_bump.png", "assets/glance/forest_default.png",
                          "assets/glance/forest_omniglot.png"]  # fmt: skip
    assert "hierarchical Bayesian model" in text and "ROPE ±1 points" in text
    for png in images[:5]:
        assert (two_protocols.parent / png).is_file()
    for protocol in ("default", "omniglot"):
        link = re.search(rf'<figure id="figure-forest_{protocol}"><a href="#([^"]+)">', text)
        assert f'<section id="{link.group(1)}">' in text
    assert text.index('id="glance"') < text.index("<details") < text.index("<h2>Contents</h2>")
    assert "Nemenyi" in text and "Kendall&#x27;s tau between neighbours" in text


def test_a_retrieval_grid_that_cannot_be_drawn_is_a_line_on_the_page(tmp_path, monkeypatch):
    load_methods()
    results = _results(tmp_path / "results", methods=("triplet",), cost=False)
    (results / "runs" / "default" / "triplet" / "seed2.embeddings").mkdir()
    module = types.ModuleType("harness.report.retrieval")

    def draw_retrieval_grid(folder, out_png, **options):
        raise HarnessError("the images are not under --data-root")

    module.draw_retrieval_grid = draw_retrieval_grid
    monkeypatch.setitem(sys.modules, "harness.report.retrieval", module)
    page = (write_report(results).parent / "default" / "triplet.html").read_text()
    assert "seed 2: no retrieval grid (the images are not under --data-root)" in page
    assert "retrieval_seed2.png" not in page
    assert NO_EMBEDDINGS not in page  # the folder is there: the line says why it failed


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, Path]:
    """(results folder, its report's index.html) of one real smoke run saved with
    `--save-embeddings`, its grid drawn by the real harness.report.retrieval."""
    results = tmp_path_factory.mktemp("saved") / "results"
    assert main(["-q", "run", "--protocol", "smoke", "--method", "contrastive", "--max-steps",
                 "2", "--device", "cpu", "--workers", "0", "--save-embeddings",
                 "--results-dir", str(results)]) == 0  # fmt: skip
    return results, write_report(results)


def test_a_saved_run_shows_its_real_retrieval_grid(saved):
    from matplotlib.image import imread

    from harness.report.retrieval import DPI, grid_size

    _, index = saved
    page = (index.parent / "smoke" / "contrastive.html").read_text(encoding="utf-8")
    assert '<img src="../assets/smoke/contrastive_retrieval_seed0.png"' in page
    assert NO_EMBEDDINGS not in page and "no retrieval grid" not in page
    grid = imread(index.parent / "assets" / "smoke" / "contrastive_retrieval_seed0.png")
    width, height = grid_size(12, 8)  # show's defaults: 4 worst, 4 best, 4 random; top 8
    assert abs(grid.shape[1] - width * DPI) <= 1 and abs(grid.shape[0] - height * DPI) <= 1


def test_a_paper_protocol_gets_its_paper_vs_reproduction_section(tmp_path):
    """Runs whose protocol names a paper (as hdc_cars196 does): the leaderboard's comparison
    with the published values, in a section the contents link to."""
    import json

    load_methods()
    results = _results(tmp_path / "results", methods=("hdc_contrastive",), cost=False)
    for path in (results / "runs" / "default" / "hdc_contrastive").glob("seed*.json"):
        record = json.loads(path.read_text())
        record["protocol"]["content"]["paper"] = {
            "reference": "hdc_iccv2017", "dataset": "cars196", "differences": "glyphs, not cars"
        }  # fmt: skip
        path.write_text(json.dumps(record))
    index = write_report(results)
    text = index.read_text(encoding="utf-8")
    section = next(name for name in _ids(index) if name.startswith("paper-protocol-default"))
    assert f'href="#{section}"' in text
    part = text.split(f'id="{section}"', 1)[1].split("</section>", 1)[0]
    assert "Paper vs reproduction" in part and "glyphs, not cars" in part
    table = next(t for t in _tables(index).values() if t[0][:2] == ["method", "metric"])
    assert table[1][:2] == ["hdc_contrastive", "recall@1"] and "73.7" in table[1]


def test_the_same_results_give_the_same_report(small, tmp_path):
    results, index, _ = small
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "harness.report.retrieval", _fake_retrieval([]))
        again = write_report(results, tmp_path / "again")
    first = sorted(p.relative_to(index.parent) for p in index.parent.rglob("*") if p.is_file())
    second = sorted(p.relative_to(again.parent) for p in again.parent.rglob("*") if p.is_file())
    assert first == second
    for name in first:
        assert (index.parent / name).read_bytes() == (again.parent / name).read_bytes(), name


def test_no_results_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    assert main(["report", "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no run results under") and err.count("\n") == 1
    assert not (tmp_path / "report").exists()


def test_another_folder_is_never_overwritten(small, tmp_path, capsys):
    results, _, _ = small
    (tmp_path / "mine.txt").write_text("keep")
    assert main(["report", "--results-dir", str(results), "--out", str(tmp_path)]) == 2
    assert "is not a report this command wrote" in capsys.readouterr().err
    assert (tmp_path / "mine.txt").read_text() == "keep"


def test_the_command_prints_the_index(small, tmp_path, capsys):
    results, _, _ = small
    out = tmp_path / "out"
    assert main(["report", "--results-dir", str(results), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out / "index.html")


# ----------------------------------------------------------------------------- the browser


@pytest.fixture(scope="module")
def browser():
    if importlib.util.find_spec("selenium") is None:
        pytest.skip("selenium is not installed (pip install -r requirements-test.txt)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.skip("chromium or chromedriver not found (Debian: apt-get install chromium "
                    "chromium-driver); the report's browser tests need them")  # fmt: skip
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1400,1000"):  # fmt: skip
        options.add_argument(argument)
    options.binary_location = chromium
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _open(driver, page: Path) -> None:
    """Load a page and check it: no SEVERE console entry, every image decoded, every local
    link to an existing file, every #anchor present on its page."""
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(page.resolve().as_uri())
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )  # every image loaded (none is lazy)
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == [], f"{page}: {severe}"
    images = driver.execute_script(
        "return Array.from(document.images).map(i => [i.getAttribute('src'), i.complete, "
        "i.naturalWidth])"
    )
    broken = [src for src, complete, width in images if not (complete and width > 0)]
    assert broken == [], f"{page}: images that do not decode: {broken}"
    links = driver.execute_script(
        "return Array.from(document.querySelectorAll('a[href]')).map(a => a.href)"
    )
    for href in links:
        url = urlparse(href)
        if url.scheme != "file":
            continue
        target = Path(unquote(url.path))
        assert target.is_file(), f"{page}: link to a missing file {href}"
        if url.fragment:
            ids = (
                driver.execute_script(
                    "return Array.from(document.querySelectorAll('[id]')).map(e => e.id)"
                )  # fmt: skip
                if target == page.resolve()
                else _ids(target)
            )
            assert unquote(url.fragment) in ids, f"{page}: no #{url.fragment} in {target}"


def _ids(page: Path) -> set[str]:
    class Ids(HTMLParser):
        found: set[str] = set()

        def handle_starttag(self, tag, attrs):
            if dict(attrs).get("id"):
                self.found.add(dict(attrs)["id"])

    parser = Ids()
    parser.found = set()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.found


def _column(driver, table_id: str, header: str) -> list[float | None]:
    """A column's numbers in the order the browser shows them (None for `-`)."""
    from selenium.webdriver.common.by import By

    table = driver.find_element(By.ID, table_id)
    headers = [th.text.rstrip(" ▲▼") for th in table.find_elements(By.CSS_SELECTOR, "thead th")]
    column = headers.index(header)
    cells = [row.find_elements(By.TAG_NAME, "td")[column].text
             for row in table.find_elements(By.CSS_SELECTOR, "tbody tr")]  # fmt: skip
    return [None if c == "-" else float(c.split(" ")[0]) for c in cells]


def _click(driver, table_id: str, header: str) -> None:
    from selenium.webdriver.common.by import By

    for th in driver.find_element(By.ID, table_id).find_elements(By.CSS_SELECTOR, "thead th"):
        if th.text.rstrip(" ▲▼") == header:
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", th)
            th.click()  # a real click, where the header is on screen
            return
    raise AssertionError(f"no column {header}")


def _screenshot(driver, path: Path) -> Path:
    """The whole page (the window stretched to its height, at most 5000 px)."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(max(height, 600), 5000))
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1000)
    print(f"screenshot: {path}")
    return path


def _check_sorting(driver, index: Path) -> None:
    table_id = next(name for name in _tables(index) if name.startswith("table-protocol-"))
    for header in ("map@r (%)", "recall@1 (%)"):
        _click(driver, table_id, header)
        ascending = _column(driver, table_id, header)
        numbers = [v for v in ascending if v is not None]
        assert numbers == sorted(numbers) and len(numbers) >= 3, (header, ascending)
        assert ascending[len(numbers) :] == [None] * (len(ascending) - len(numbers))  # `-` last
        _click(driver, table_id, header)
        descending = _column(driver, table_id, header)
        assert [v for v in descending if v is not None] == sorted(numbers, reverse=True)
    rows = [r[0] for r in _main_table(index)[1:]]
    _click(driver, table_id, "method")
    from selenium.webdriver.common.by import By

    table = driver.find_element(By.ID, table_id)
    shown = [row.find_elements(By.TAG_NAME, "td")[0].text
             for row in table.find_elements(By.CSS_SELECTOR, "tbody tr")]  # fmt: skip
    assert sorted(shown) == sorted(rows)  # the browser's collation orders `_` its own way:
    assert [s[0] for s in shown] == sorted(s[0] for s in rows)  # by first letter


def test_every_page_works_in_a_browser(small, browser, tmp_path):
    _, index, _ = small
    pages = [index, index.parent / "cost.html", *sorted((index.parent / "default").glob("*.html"))]
    assert len(pages) == 2 + len(METHODS)
    for page in pages:
        _open(browser, page)
    _open(browser, index)
    _screenshot(browser, tmp_path / "index.png")
    _check_sorting(browser, index)
    _open(browser, index.parent / "default" / f"{SAVED}.html")
    _screenshot(browser, tmp_path / f"{SAVED}.png")


def test_the_figures_at_a_glance_load_in_a_browser(two_protocols, browser, tmp_path):
    _open(browser, two_protocols)  # every image decodes, every anchor resolves
    widths = browser.execute_script(
        "return Array.from(document.querySelectorAll('#glance img'))"
        ".map(i => [i.getAttribute('src'), i.naturalWidth])"
    )
    assert [src for src, _ in widths][:3] == ["assets/glance/cd_diagram.png",
                                              "assets/glance/equivalence.png",
                                              "assets/glance/ranks_bump.png"]  # fmt: skip
    assert len(widths) == 5 and all(width > 0 for _, width in widths), widths
    _screenshot(browser, tmp_path / "glance-index.png")


def test_a_real_retrieval_grid_loads_in_a_browser(saved, browser, tmp_path):
    _, index = saved
    page = index.parent / "smoke" / "contrastive.html"
    _open(browser, page)
    _screenshot(browser, tmp_path / "retrieval-page.png")


@pytest.mark.slow
def test_the_report_of_the_reference_results_works_in_a_browser(browser, tmp_path):
    """The whole committed results/reference (3 protocols, a cost record, tuning studies):
    built into tmp_path, its index checked in the browser. Its index is the committed one's
    (results/reference/report, which the README links)."""
    load_methods()
    index = write_report(REFERENCE, tmp_path / "report")
    _open(browser, index)
    _check_sorting(browser, index)
    _screenshot(browser, tmp_path / "reference-index.png")
    _open(browser, index.parent / "cost.html")
    committed = REFERENCE / "report" / "index.html"
    assert index.read_text(encoding="utf-8") == committed.read_text(encoding="utf-8"), (
        "results/reference/report is stale: python -m harness report --results-dir "
        "results/reference"
    )
