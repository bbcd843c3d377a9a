"""The tutorials (notebooks/, run by nbmake in `make test`), rendered: this file is at the root
because pytest applies a conftest only to the tests under its folder. The tests' own fixtures are
in tests/conftest.py."""

import os
import sys
from pathlib import Path

import pytest

# One torch (OpenMP) thread a process, for every process the suite starts (children inherit it):
# `make test` runs two workers on a 2-core machine, each starting PS and site processes, and beyond
# the cores OpenMP's spin-waiting threads burn the CPU the other processes need (a model test ran
# 10x slower under load with torch's default of one thread a core). Set before anything imports
# torch; the tests that choose a thread count (`--threads`) still do.
assert "torch" not in sys.modules, "a pytest plugin imported torch before the thread count was set"
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


# ------------------------------------------------------------------ tutorials, rendered
# nbmake executes each tutorial and keeps nothing; keep the executed copy, and once the notebook
# has passed, check that its HTML export draws every figure (tests/rendered.py) and that what it
# printed about its run is what the run's log says (tests/claims.py).

def _keep_executed_notebooks() -> None:
    from nbmake.nb_run import NotebookRun

    execute = NotebookRun.execute
    if getattr(execute, "keeps_copy", False):
        return

    def execute_and_keep(self):
        import nbformat

        from tests.rendered import EXECUTED

        result = execute(self)
        EXECUTED.mkdir(parents=True, exist_ok=True)
        nbformat.write(result.nb, str(EXECUTED / Path(self.filename).name))
        return result
    execute_and_keep.keeps_copy = True
    NotebookRun.execute = execute_and_keep


def pytest_configure(config):
    # `make check` runs without nbmake (-p no:nbmake): it runs no tutorial, and nbmake's imports
    # (nbformat, jsonschema's format checkers) cost each pytest process 2 s of CPU.
    if config.pluginmanager.hasplugin("nbmake"):
        _keep_executed_notebooks()


def _starts_ssh_sites(item) -> bool:
    return type(item).__name__ == "NotebookItem" and "LocalSshHost" in Path(str(item.fspath)).read_text()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """A tutorial that starts sites on SSH hosts of this machine (LocalSshHost) installs wantrain
    there into the suite's shared folder (tests/conftest.py: shared_venvs), installed before its
    kernel starts, instead of an install of its own into ~/.wantrain/venvs."""
    result = yield
    if _starts_ssh_sites(item):
        from tests.conftest import shared_venvs
        # (pytest's own factory of temporary folders: a notebook item takes no fixtures)
        os.environ["WANTRAIN_VENVS"] = shared_venvs(item.config._tmp_path_factory.getbasetemp())
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    if _starts_ssh_sites(item):
        os.environ.pop("WANTRAIN_VENVS", None)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    if type(item).__name__ == "NotebookItem":
        from tests.claims import check_claims
        from tests.rendered import EXECUTED, check_rendered
        executed = EXECUTED / Path(str(item.fspath)).name
        wanted, drawn = check_rendered(executed)
        print(f"{executed.name}: {len(drawn)} figures drawn in its HTML export of {len(wanted)}")
        if check_claims(executed):
            print(f"{executed.name}: every figure it printed about its run recounted from the run's log")
    return result
