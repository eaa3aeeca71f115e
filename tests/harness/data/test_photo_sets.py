"""The real-photo datasets as their files (harness.data.photo_sets) and `data fetch`
(harness.data.rebuild), offline: the GitHub archive's stand-in is made from the shared cub100
files placed under the repository's own paths, served from a file or a local HTTP server; the
cars and groceries sample sources rebuild their rows of the manifest."""

from __future__ import annotations

import csv
import hashlib
import http.server
import io
import os
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from harness.cli import main
from harness.core import HarnessError, load_protocol, protocol_names
from harness.data import photo_sets, rebuild
from harness.data.photo_sets import SETS, manifest
from harness.data.rebuild import open_data

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "data"
CUB = SHARED / "cub100" / "cub100.zip"
needs_cub = pytest.mark.skipif(not CUB.is_file(), reason=f"{CUB} not present")
COMMIT = SETS["cub100"].commit


@pytest.fixture(autouse=True)
def _own_folders(tmp_path, monkeypatch):
    """No stamp or fetched data from elsewhere: a fresh cache and user data folder."""
    monkeypatch.setenv("DML_HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DML_HARNESS_DATA", str(tmp_path / "userdata"))
    monkeypatch.delenv(rebuild.FETCH_ENV, raising=False)


@pytest.fixture(scope="module")
def github_archive(tmp_path_factory) -> Path:
    """What codeload.github.com serves for serizba/vision at the pinned commit, as far as the
    manifest reads it: `vision-<commit>/ex03/task2/bird_dataset/...`."""
    if not CUB.is_file():
        pytest.skip(f"{CUB} not present")
    out = tmp_path_factory.mktemp("github") / "vision.tar.gz"
    with zipfile.ZipFile(CUB) as z, tarfile.open(out, "w:gz", compresslevel=1) as tar:
        for name in z.namelist():
            if not name.endswith("/"):
                data = z.read(name)
                info = tarfile.TarInfo(f"vision-{COMMIT}/ex03/task2/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out


class _Server(http.server.ThreadingHTTPServer):
    body: bytes = b""
    cut_first_at: int | None = None  # the first response stops after this many bytes
    html: bool = False
    ranges: list[str | None]


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        server: _Server = self.server  # type: ignore[assignment]
        server.ranges.append(self.headers.get("Range"))
        if server.html:
            page = b"<!DOCTYPE html><html>sign in</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        start = int(self.headers["Range"][6:-1]) if self.headers.get("Range") else 0
        body = server.body[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Type", "application/x-gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if server.cut_first_at is not None:
            body, server.cut_first_at = body[: server.cut_first_at], None
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server():
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.ranges = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _url(server: _Server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/vision.tar.gz"


# --- the manifests ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SETS))
def test_each_shipped_manifest_is_the_published_zip_file_by_file(name):
    archive = SHARED / name / f"{name}.zip"
    if not archive.is_file():
        pytest.skip(f"{archive} not present")
    want = manifest(name).expected
    with zipfile.ZipFile(archive) as z:
        found = {n: hashlib.sha256(z.read(n)).hexdigest() for n in z.namelist()
                 if not n.endswith("/")}  # fmt: skip
    assert set(found) - set(want) == set(SETS[name].beside)  # the builder's labels table
    assert {n: found[n] for n in want} == want
    counts = {"cub100": 5907, "cars196_mini": 2940, "grocery_store_mini": 3233}  # + a licence
    assert len(want) == counts[name]


def test_the_grocery_coarse_classes_are_the_published_labels_tables():
    """Derived from the shipped manifest's source paths, never read from the data."""
    archive = SHARED / "grocery_store_mini" / "grocery_store_mini.zip"
    if not archive.is_file():
        pytest.skip(f"{archive} not present")
    from harness.data.photo_zip import GROCERIES

    with zipfile.ZipFile(archive) as z:
        table = z.read("grocery_store_mini/manifest.csv").decode()
    published = {r["class"]: r["coarse_class"] for r in csv.DictReader(io.StringIO(table))}
    assert len(published) == 81 and len(set(published.values())) == 43
    assert {c: GROCERIES.coarse(c) for c in published} == published


def test_data_verify_knows_every_dataset_a_shipped_protocol_reads():
    from harness.cli.data import MADE, OWN, PAPERS

    known = {*SETS, *PAPERS, *OWN, *MADE}
    used = {load_protocol(p).dataset.name for p in protocol_names()}
    assert used <= known, used - known


# --- accepted by content ---------------------------------------------------------------------


@needs_cub
def test_a_cub100_zipped_by_the_recipe_is_accepted_and_hashed_only_once(tmp_path, monkeypatch):
    """`zip -qr cub100.zip bird_dataset`: the same files in another order, other timestamps, so
    another container sha256; accepted by content, and the second open reads no file."""
    with zipfile.ZipFile(CUB) as src, zipfile.ZipFile(tmp_path / "cub100.zip", "w") as out:
        for name in sorted(src.namelist(), reverse=True):
            info = zipfile.ZipInfo(name, date_time=(2026, 11, 27, 12, 0, 0))
            out.writestr(info, src.read(name), zipfile.ZIP_DEFLATED)
    assert (
        hashlib.sha256((tmp_path / "cub100.zip").read_bytes()).hexdigest()
        != SETS["cub100"].zip_sha256
    )
    with open_data("cub100", tmp_path) as files:
        assert files.kind == "zip" and files.provenance == {"exact": True}
    assert (tmp_path / ".cub100.verified.json").is_file()
    reads = []
    real = photo_sets.DataFiles.read
    monkeypatch.setattr(photo_sets.DataFiles, "read", lambda s, n: reads.append(n) or real(s, n))
    with open_data("cub100", tmp_path):
        assert reads == []  # the stamp: no file hashed again


@needs_cub
def test_a_folder_with_a_missing_an_extra_and_an_altered_photo_is_named_in_one_line(tmp_path):
    with zipfile.ZipFile(CUB) as z:
        z.extractall(tmp_path)
    images = tmp_path / "bird_dataset" / "images"
    (images / "Mallard" / "0000.jpg").unlink()
    (images / "Gadwall" / "extra.jpg").write_bytes(b"x")
    with open(images / "Blue_Jay" / "0000.jpg", "ab") as f:
        f.write(b"x")
    code_line = "data fetch cub100 --data-root"
    with pytest.raises(HarnessError) as err:
        open_data("cub100", tmp_path)
    message = str(err.value)
    assert "\n" not in message and code_line in message
    assert "1 missing (bird_dataset/images/Mallard/0000.jpg)" in message
    assert "1 extra (bird_dataset/images/Gadwall/extra.jpg)" in message
    assert "1 altered (bird_dataset/images/Blue_Jay/0000.jpg)" in message


def test_a_damaged_member_of_a_verified_zip_is_one_line_naming_the_file(tmp_path):
    """A byte changed inside a photo after verification (the stamp still matches: same size
    and time) is found on reading: one HarnessError naming the file, not BadZipFile."""
    archive = SHARED / "grocery_store_mini" / "grocery_store_mini.zip"
    if not archive.is_file():
        pytest.skip(f"{archive} not present")
    copy = tmp_path / "grocery_store_mini.zip"
    copy.write_bytes(archive.read_bytes())
    open_data("grocery_store_mini", tmp_path).__exit__()  # verified: a stamp beside it
    with zipfile.ZipFile(copy) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(".jpg"))
    times = (copy.stat().st_atime_ns, copy.stat().st_mtime_ns)
    with open(copy, "r+b") as f:  # the middle of that member's compressed bytes
        f.seek(info.header_offset + 30 + len(info.filename) + info.compress_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(copy, ns=times)
    with open_data("grocery_store_mini", tmp_path) as files:
        with pytest.raises(HarnessError) as err:
            files.read(info.filename)
    message = str(err.value)
    assert "\n" not in message and info.filename in message and "fetch the dataset" in message


def test_another_datasets_files_are_named_for_what_they_are(tmp_path):
    cars = SHARED / "cars196_mini" / "cars196_mini.zip"
    if not cars.is_file():
        pytest.skip(f"{cars} not present")
    (tmp_path / "cars196_mini.zip").symlink_to(cars)
    with pytest.raises(HarnessError, match="it holds cars196_mini, not cub100"):
        open_data("cub100", tmp_path)


def test_missing_data_names_the_command_that_fetches_it(tmp_path, capsys):
    code = main(["run", "--protocol", "cars", "--method", "contrastive", "--seeds", "0",
                 "--data-root", str(tmp_path), "--results-dir", str(tmp_path / "r"), "--quiet"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert f"python -m harness data fetch cars196_mini --data-root {tmp_path}" in err[0]
    assert "--fetch" in err[0] and not (tmp_path / "r").exists()


# --- data fetch ------------------------------------------------------------------------------


@needs_cub
def test_fetch_builds_cub100_from_the_github_archive_and_it_verifies(github_archive, tmp_path,
                                                                     capsys):  # fmt: skip
    root = tmp_path / "data"
    assert main(["data", "fetch", "cub100", "--data-root", str(root), "--from",
                 str(github_archive)]) == 0  # fmt: skip
    with zipfile.ZipFile(CUB) as z:
        for name in ("bird_dataset/classes.txt", "bird_dataset/images/Mallard/0000.jpg"):
            assert (root / name).read_bytes() == z.read(name)
    assert not [p for p in root.iterdir() if p.name.startswith(".cub100.building")]
    assert main(["data", "verify", "--dataset", "cub100", "--data-root", str(root)]) == 0
    assert "OK" in capsys.readouterr().out


@needs_cub
def test_fetch_downloads_resumes_an_interrupted_download_and_prints_the_terms(
    github_archive, server, tmp_path, capsys
):
    server.body = github_archive.read_bytes()
    server.cut_first_at = len(server.body) // 3  # the first connection drops a third in
    monkey = rebuild.TRIES
    assert monkey >= 2
    root = tmp_path / "data"
    assert main(["data", "fetch", "cub100", "--data-root", str(root), "--from", _url(server)]) == 0
    assert server.ranges[0] is None and server.ranges[1] == f"bytes={len(server.body) // 3}-"
    assert "research and non-commercial" in capsys.readouterr().err
    with open_data("cub100", root) as files:
        assert files.kind == "folder"
    assert not list((tmp_path / "cache" / "downloads").glob("*"))  # the archive is not kept


def test_a_server_that_returns_html_is_one_line_and_nothing_is_written(server, tmp_path, capsys):
    server.html = True
    root = tmp_path / "data"
    assert main(["data", "fetch", "cub100", "--data-root", str(root), "--from", _url(server)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if line.startswith("error:")]) == 1
    assert "returned a web page, not an archive" in err[-1]
    assert not (root / "bird_dataset").exists()


def test_a_download_that_keeps_failing_is_one_line_and_keeps_its_part(server, tmp_path,
                                                                       monkeypatch):  # fmt: skip
    server.body = b"\x1f\x8b" + b"0" * 5000
    monkeypatch.setattr(rebuild, "TRIES", 1)
    monkeypatch.setattr(rebuild.time, "sleep", lambda s: None)
    server.cut_first_at = 1000
    target = tmp_path / "dl" / "a.archive"
    with pytest.raises(HarnessError, match="could not download .*is kept and the same command "
                       "resumes it"):  # fmt: skip
        rebuild.download(_url(server), target, tries=1)
    assert (tmp_path / "dl" / "a.archive.part").stat().st_size == 1000 and not target.exists()
    assert rebuild.download(_url(server), target).read_bytes() == server.body  # resumed


@needs_cub
def test_a_tampered_source_file_is_refused_and_nothing_is_left(github_archive, tmp_path):
    bad = tmp_path / "tampered.tar.gz"
    with tarfile.open(github_archive) as src, tarfile.open(bad, "w:gz", compresslevel=1) as out:
        for info in src:
            data = src.extractfile(info).read()
            if info.name.endswith("images/Mallard/0000.jpg"):
                data = data[:-1] + bytes([data[-1] ^ 1])
            out.addfile(info, io.BytesIO(data))
    root = tmp_path / "data"
    with pytest.raises(HarnessError, match="source file .*Mallard/0000.jpg .* has sha256"):
        rebuild.fetch("cub100", root, source=str(bad))
    assert list(root.iterdir()) == []  # no half-built folder


def test_an_unwritable_data_root_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    root = tmp_path / "file" / "data"
    assert main(["data", "fetch", "cub100", "--data-root", str(root), "--from", "x.tar.gz"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot write to the data root {root}" in err[0]


@pytest.mark.parametrize("name", ["cars196_mini", "grocery_store_mini"])
def test_the_sample_classes_rebuild_to_the_manifests_bytes(name, tmp_path):
    sample = SHARED / name / f"{name}.sources-sample.zip"
    if not sample.is_file():
        pytest.skip(f"{sample} not present")
    with zipfile.ZipFile(sample) as z:
        sources = set(z.namelist())
    rows = [r for r in manifest(name).rows if r.source_path in sources]
    assert {r.rule for r in rows} >= {"short_side_256_bicubic_q90"}
    assert rebuild.build(name, rows, sample, tmp_path) == {"exact": True}
    for row in rows:
        assert hashlib.sha256((tmp_path / row.file).read_bytes()).hexdigest() == row.file_sha256


def test_the_grocery_licence_is_the_source_repositorys_licence(tmp_path):
    archive = SHARED / "grocery_store_mini" / "grocery_store_mini.zip"
    if not archive.is_file():
        pytest.skip(f"{archive} not present")
    (row,) = [r for r in manifest("grocery_store_mini").rows if r.source_path == "LICENSE"]
    with zipfile.ZipFile(archive) as z:
        text = z.read(row.file)
    source = tmp_path / "GroceryStoreDataset-fc80ba9.zip"  # the repository's top folder
    with zipfile.ZipFile(source, "w") as z:
        z.writestr("GroceryStoreDataset-fc80ba9/LICENSE", text)
    assert rebuild.build("grocery_store_mini", [row], source, tmp_path / "out") == {"exact": True}
    assert (tmp_path / "out" / row.file).read_bytes().startswith(b"MIT License")


def test_a_derived_file_that_another_pillow_encodes_otherwise_is_kept_and_recorded(tmp_path,
                                                                                   monkeypatch):  # fmt: skip
    name = "grocery_store_mini"
    sample = SHARED / name / f"{name}.sources-sample.zip"
    if not sample.is_file():
        pytest.skip(f"{sample} not present")
    real = rebuild.derive
    monkeypatch.setattr(rebuild, "derive", lambda rule, data: real(rule, data) + b"\0")
    rows = [r for r in manifest(name).rows if r.source_path.startswith("dataset/")][:3]
    monkeypatch.setattr(rebuild, "members", lambda path, wanted: iter(
        (r.source_path, zipfile.ZipFile(sample).read(r.source_path)) for r in rows))  # fmt: skip
    prov = rebuild.build(name, rows, sample, tmp_path)
    assert prov["exact"] is False and len(prov["differing"]) == 3 and prov["pillow"]
    assert all((tmp_path / f).is_file() for f in prov["differing"])


@needs_cub
def test_a_run_with_fetch_builds_missing_data_first(github_archive, tmp_path, monkeypatch):
    spec = SETS["cub100"]
    monkeypatch.setitem(SETS, "cub100", photo_sets.PhotoSet(
        spec.name, spec.zip_sha256, spec.repo, spec.commit, spec.terms, spec.size))  # fmt: skip
    monkeypatch.setattr(photo_sets.PhotoSet, "archive_url", property(
        lambda s: github_archive.as_uri()))  # fmt: skip
    monkeypatch.setattr(photo_sets.PhotoSet, "shared_root", property(lambda s: tmp_path / "no"))
    with pytest.raises(HarnessError, match="data fetch cub100"):
        open_data("cub100", None)
    monkeypatch.setenv(rebuild.FETCH_ENV, "1")
    with open_data("cub100", None) as files:
        assert files.path == tmp_path / "userdata" / "cub100" and files.kind == "folder"


@needs_cub
def test_files_another_pillow_derived_are_accepted_and_every_run_says_so(tmp_path):
    """A fetch records the files whose bytes differ (their own sha256) beside the data: they
    verify, the data's provenance says so, and a run's source line and record carry it."""
    from harness.check.machine import rebuilt_data
    from harness.data import DATASETS

    with zipfile.ZipFile(CUB) as z:
        z.extractall(tmp_path)
    photo = "bird_dataset/images/Mallard/0000.jpg"
    with open(tmp_path / photo, "ab") as f:
        f.write(b"\0")  # still a JPEG: another encoder's bytes
    files = photo_sets.DataFiles(tmp_path, manifest("cub100").tops)
    with pytest.raises(HarnessError, match="1 altered"):
        photo_sets.verify("cub100", files, "")
    differing = {photo: hashlib.sha256((tmp_path / photo).read_bytes()).hexdigest()}
    provenance = {"exact": False, "pillow": "99.0", "differing": differing}
    photo_sets.write_stamp("cub100", files, provenance)
    os.utime(tmp_path / photo, ns=(1, 1))  # a stale stamp: every file is hashed again, and
    # the recorded difference still counts
    with open_data("cub100", tmp_path) as found:
        assert found.provenance["differing"] == differing
    data = DATASETS.get("cub100")(tmp_path, None, classes=4)
    assert data.provenance["pillow"] == "99.0" and "compare numbers statistically" in data.source

    class Run:  # what rebuilt_data reads of a result
        dataset = type("D", (), {"provenance": data.provenance})()

    assert "Pillow 99.0: 1 derived files differ" in rebuilt_data({"m": [Run()]})
    assert rebuilt_data({"m": [type("R", (), {"dataset": None})()]}) == ""
