"""otpmesh.monarch.job: Monarch's jobs (``ProcessJob``, ``LocalJob``) give host meshes, and a
host mesh's ``spawn_procs`` places one process per host and per point of `per_host`, as
Monarch's own tests pin (meta-pytorch/monarch, python/tests/test_host_mesh.py and
test_proc_mesh.py, which use ``ProcessJob`` for their hosts)."""

from __future__ import annotations

import pytest

from otpmesh.monarch import Extent, HostMesh, SupervisionError, this_host
from otpmesh.monarch.job import JobState, LocalJob, ProcessJob
from tests.conftest import run_trio
from tests.monarch_actors import Counter


def test_a_process_job_names_host_meshes_of_that_many_hosts() -> None:
    job = ProcessJob({"trainers": 2, "dataloaders": 1})
    state = job.state(cached_path=None)
    assert isinstance(state, JobState) and job.active
    trainers = state.trainers
    assert isinstance(trainers, HostMesh)
    assert trainers.extent == {"hosts": 2} and isinstance(trainers.extent, Extent)
    assert (trainers.extent.labels, trainers.extent.sizes) == (["hosts"], [2])
    assert state.dataloaders.size() == 1
    assert not trainers.is_fake_in_process
    with pytest.raises(AttributeError, match=r"'evaluators' is not a valid host mesh name\. "):
        state.evaluators  # noqa: B018
    job.kill()
    assert not job.active


def test_spawn_procs_on_a_job_mesh_places_a_process_per_host_and_per_host_point() -> None:
    async def body() -> None:
        hosts = ProcessJob({"hosts": 2}).state(cached_path=None).hosts
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        assert procs.extent == {"hosts": 2, "gpus": 2}
        counters = procs.spawn("counters", Counter, 0)
        where = (await counters.where.call()).values()
        assert [w["coords"] for w in where] == [
            {"hosts": h, "gpus": g} for h in range(2) for g in range(2)
        ]
        assert len(set((await counters.pid.call()).values())) == 4
        await hosts.shutdown()

    run_trio(body, timeout=30)


def test_a_shut_down_host_mesh_refuses_spawns_and_a_second_shutdown() -> None:
    async def body() -> None:
        job = ProcessJob({"hosts": 1})
        async with job.state(cached_path=None).hosts as hosts:
            counter = hosts.spawn_procs().spawn("c", Counter, 0)
            assert (await counter.get_value.call()).values() == [0]
        with pytest.raises(SupervisionError):  # its process is gone
            await counter.get_value.call()
        with pytest.raises(RuntimeError, match="HostMesh has already been shut down"):
            hosts.spawn_procs()
        with pytest.raises(RuntimeError, match="HostMesh has already been shut down"):
            await hosts.shutdown()

    run_trio(body, timeout=30)


def test_a_slice_of_a_host_mesh_cannot_shut_it_down_nor_can_this_host() -> None:
    hosts = ProcessJob({"hosts": 2}).state(cached_path=None).hosts
    one = hosts.slice(hosts=1)
    assert one.extent == {}
    assert hosts.slice(hosts=slice(0, 1)).extent == {"hosts": 1}
    for reference in (one, this_host()):
        with pytest.raises(RuntimeError, match="reference instead of owned"):
            reference.shutdown()


def test_stopping_one_states_mesh_leaves_the_processes_of_anothers() -> None:
    async def body() -> None:
        job = ProcessJob({"hosts": 2})
        first, second = job.state(cached_path=None).hosts, job.state(cached_path=None).hosts
        mine = first.spawn_procs(per_host={"gpus": 1}).spawn("first", Counter, 0)
        theirs = second.spawn_procs(per_host={"gpus": 1}).spawn("second", Counter, 0)
        assert (await mine.get_value.call()).values() == [0, 0]
        await first.stop()  # the hosts stay: first may spawn again
        with pytest.raises(SupervisionError):
            await mine.get_value.call()
        assert (await theirs.get_value.call()).values() == [0, 0]
        again = first.spawn_procs().spawn("again", Counter, 3)
        assert (await again.get_value.call()).values() == [3, 3]
        job.kill()  # in trio code: the processes stop in the background

    run_trio(body, timeout=30)


def test_a_local_job_is_this_host_under_each_name() -> None:
    state = LocalJob(hosts=("trainers", "generators")).state(cached_path=None)
    assert state.trainers is this_host() and state.generators is this_host()
    with pytest.raises(TypeError, match="a sequence of names, not the string 'hosts'"):
        LocalJob(hosts="hosts")


def test_what_a_process_job_cannot_do_says_what_to_do_instead() -> None:
    with pytest.raises(ValueError, match=r"ProcessJob\(\{'hosts': 0\}\): .* at least 1"):
        ProcessJob({"hosts": 0})
    with pytest.raises(NotImplementedError, match=r"env=.*forked with the controller's"):
        ProcessJob({"hosts": 1}, env={"A": "1"})
    with pytest.raises(NotImplementedError, match="a batch client is not run here"):
        ProcessJob({"hosts": 1}).apply(client_script="train.py")
