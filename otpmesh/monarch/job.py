"""Monarch's ``monarch.job``: a job names host meshes, ``job.state()`` gives them.

    state = ProcessJob({"trainers": 2, "dataloaders": 1}).state(cached_path=None)
    procs = state.trainers.spawn_procs(per_host={"gpus": 4})   # {"hosts": 2, "gpus": 4}

``LocalJob`` gives ``this_host()`` for each name. ``ProcessJob`` gives, for each name, a
``HostMesh`` of that many hosts, all of them this machine: ``spawn_procs`` starts the processes
here, one per point of ``{"hosts": n, **per_host}``, as Monarch's ProcessJob does (its "hosts"
are local worker processes). For hosts that are other machines use ``otpmesh.cluster`` with a
launcher (``otpmesh.launchers``: ``SSH``, ``Slurm``); Monarch's ``LoginJob``/``SSHJob`` start
Monarch's own worker loop on each host, which otpmesh does not have.

Monarch saves a job to ``cached_path`` so that a later program reconnects to its hosts; here a
job's hosts are its program's, so ``cached_path`` is accepted and nothing is saved.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from ._hosts import HostMesh, job_hosts, kill, this_host

DEFAULT_JOB_PATH = ".monarch/job_state.pkl"


class JobState:
    """A job's host meshes, each an attribute named as the job names it (``state.trainers``)."""

    def __init__(self, hosts: Mapping[str, HostMesh]) -> None:
        self._hosts = dict(hosts)

    def __getattr__(self, attr: str) -> HostMesh:
        if attr.startswith("__") or attr == "_hosts":
            raise AttributeError(attr)
        try:
            return self._hosts[attr]
        except KeyError:
            available = ", ".join(sorted(self._hosts))
            raise AttributeError(
                f"'{attr}' is not a valid host mesh name. Available names: {available}"
            ) from None

    def __repr__(self) -> str:
        return f"JobState(hosts={self._hosts})"


class JobTrait(ABC):
    """A job: ``apply()`` brings its hosts up (once), ``state()`` gives their host meshes,
    ``kill()`` stops them."""

    def __init__(self) -> None:
        self._active = False

    @property
    def active(self) -> bool:
        """Whether the job is applied and not killed."""
        return self._active

    def apply(self, client_script: str | None = None) -> None:
        """Bring the job's hosts up; nothing if it is up already."""
        if client_script is not None:
            raise NotImplementedError(
                f"apply(client_script={client_script!r}): a batch client is not run here; "
                "run the script itself, with the job in it (job.state())"
            )
        if not self._active:
            self._create(None)
            self._active = True

    def state(self, cached_path: str | None = DEFAULT_JOB_PATH) -> JobState:
        """The job's host meshes (applying it first if need be). `cached_path`: accepted; a
        job's hosts here are its program's, so nothing is saved for a later one."""
        self.apply()
        return self._state()

    def kill(self) -> None:
        """Stop every process on the job's hosts, and the hosts."""
        if self._active:
            self._kill()
        self._active = False

    def can_run(self, spec: JobTrait) -> bool:
        """Whether this job's hosts can run `spec` (Monarch reuses a saved job then)."""
        return False

    @abstractmethod
    def _create(self, client_script: str | None) -> None: ...

    @abstractmethod
    def _state(self) -> JobState: ...

    @abstractmethod
    def _kill(self) -> None: ...


class LocalJob(JobTrait):
    """``this_host()`` under each of `hosts`' names: the same program runs locally or on a
    cluster by changing its job."""

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        super().__init__()
        if isinstance(hosts, str):
            raise TypeError(f"LocalJob(hosts=...): a sequence of names, not the string {hosts!r}")
        self._host_names = tuple(hosts)

    def _create(self, client_script: str | None) -> None:
        pass  # this host is always up

    def _state(self) -> JobState:
        return JobState({name: this_host() for name in self._host_names})

    def _kill(self) -> None:
        pass


class ProcessJob(JobTrait):
    """Named host meshes of this machine: ``ProcessJob({"trainers": 2})`` gives
    ``state.trainers``, a ``HostMesh`` of extent ``{"hosts": 2}``."""

    def __init__(self, meshes: Mapping[str, int], env: Mapping[str, str] | None = None) -> None:
        super().__init__()
        for name, hosts in meshes.items():
            if not isinstance(hosts, int) or isinstance(hosts, bool) or hosts < 1:
                raise ValueError(
                    f"ProcessJob({{{name!r}: {hosts!r}}}): a mesh's number of hosts is an "
                    "int of at least 1"
                )
        if env:
            raise NotImplementedError(
                "ProcessJob(env=...): otpmesh's workers are forked with the controller's "
                "environment; set it before the program starts, or in the actor's constructor"
            )
        self._meshes = dict(meshes)
        self._given: list[HostMesh] = []  # every state()'s meshes: kill() stops them all

    def _create(self, client_script: str | None) -> None:
        self._given = []

    def _state(self) -> JobState:
        # Each state() gives host meshes of their own over the same hosts, as Monarch's
        # (a connection each): stopping one stops the processes spawned through it alone.
        hosts = {name: job_hosts(n) for name, n in self._meshes.items()}
        self._given += hosts.values()
        return JobState(hosts)

    def _kill(self) -> None:
        given, self._given = self._given, []
        for hosts in given:
            kill(hosts)

    def can_run(self, spec: JobTrait) -> bool:
        return isinstance(spec, ProcessJob) and spec._meshes == self._meshes and self.active


__all__ = ["DEFAULT_JOB_PATH", "JobState", "JobTrait", "LocalJob", "ProcessJob"]
