"""Worker processes for the rule library's long jobs (a generation's enumeration and verification, the library's
verification): one pool a job, answers in the order of the tasks, so that what a job finds does not depend on how
many processes ran it."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any


def default_jobs() -> int:
    """The processes a job runs in unless told: one per core this process may use."""
    return len(os.sched_getaffinity(0))


class Workers:
    """A function over many tasks, in `jobs` worker processes where there are several (started at the first call
    that has work for more than one, spawned: the caller's process runs egglog, whose threads a fork would copy
    mid-state), one pool for a whole job. The answers come back in the order of the tasks, so that a generation's
    rules do not depend on `jobs`."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        """`fn` of each task, in order."""
        return list(self.each(fn, tasks))

    def each(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> Iterator[Any]:
        """`fn` of each task, in order, each as soon as it and those before it are done."""
        if self.jobs <= 1 or len(tasks) <= 1:
            return (fn(t) for t in tasks)
        if self.pool is None:
            self.pool = concurrent.futures.ProcessPoolExecutor(
                self.jobs, mp_context=multiprocessing.get_context("spawn")
            )
        return self.pool.map(fn, tasks)
