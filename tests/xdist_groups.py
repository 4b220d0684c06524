"""The xdist groups of ``make test`` (``pytest -n 2 --dist loadgroup``): which test files
run one after another on one xdist process, decided from each test's file.

xdist 3.8 hands a test's ``xdist_group`` mark to its scheduler as an ``@group`` suffix it
writes into the node id on the worker; pytest 9.2's structured node ids ignore that write
(pytest-dev/pytest-xdist#1386), so marks alone group nothing: the tests of a group spread
over both processes, and a module-scoped fixture (the image, the Temporal UI stack) is
built once on each. :func:`pytest_xdist_make_scheduler` (a hook ``tests/conftest.py``
exposes) groups by file instead, which needs nothing from the workers.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling  # type: ignore[import-untyped]  # no py.typed

#: Test files whose tests start several real processes, kill them and assert how fast the
#: survivors take over. They share one group, so they run one after another on one process
#: while the other process runs the light files, and two fault tests never compete for the
#: two cores.
PROCESS_HEAVY_FILES = frozenset(
    {
        "test_scale_out.py",
        "test_fault.py",
        "test_review_crash.py",
        "test_mcp_fault.py",
        "test_ops.py",
        "test_recovery.py",
        "test_idle_means_deliverable.py",
        "test_idempotency_replicas.py",
        "test_embedded_stack.py",
    }
)

#: ``{test file name: group}``. The image test (a buildah build, then the image's
#: processes) is minutes long and mostly waits on the build: a group of its own runs it
#: beside the ``processes`` group instead of after it, its image built once, and the light
#: files fill in around both. The Temporal UI tests share one module stack (one dev server
#: and UI, not two); the S3 workspace tests one moto server.
XDIST_GROUPS: dict[str, str] = {
    **dict.fromkeys(PROCESS_HEAVY_FILES, "processes"),
    "test_deploy_image.py": "image",
    "test_temporal_ui.py": "temporal-ui",
    "test_workspaces_s3.py": "s3",  # one moto S3 server for the module, not one per process
}


def group_of(nodeid: str) -> str | None:
    """The group of the test ``nodeid`` (``tests/test_fault.py::test_x[1]``), or None."""
    path = nodeid.split("::", 1)[0]
    return XDIST_GROUPS.get(path.rsplit("/", 1)[-1])


class FileGroupScheduling(LoadGroupScheduling):  # type: ignore[misc]
    """``--dist loadgroup`` whose groups are :data:`XDIST_GROUPS`: a grouped test's scope
    is its group, any other test's its own node id (as loadgroup without a mark)."""

    def _split_scope(self, nodeid: str) -> str:
        scope: str = group_of(nodeid) or super()._split_scope(nodeid)
        return scope


@pytest.hookimpl(optionalhook=True)  # a run with `-p no:xdist` has no such hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The scheduler of ``--dist loadgroup``: :class:`FileGroupScheduling`; None (xdist's
    own) for any other ``--dist``."""
    if config.getvalue("dist") == "loadgroup":
        return FileGroupScheduling(config, log)
    return None
