"""The job registry: private directories and files, ids, unsafe places refused."""
import os
import stat

import pytest

from dtrace_mk.launch import jobs


def _mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def test_new_job_is_private_and_findable(runtime_dir):
    job = jobs.new_job(2, ["python", "-m", "x"], "sim")
    assert jobs.JOB_ID_RE.match(job.id)
    assert _mode(job.dir) == 0o700
    assert _mode(job.token_path) == 0o600
    assert len(job.token) == 64
    assert jobs.find_job(job.id).dir == job.dir
    assert job.info()["ranks"] == 2 and job.info()["command"] == ["python", "-m", "x"]
    assert [j.id for j in jobs.list_jobs()] == [job.id]
    other = jobs.new_job()
    assert other.token != job.token and other.id != job.id


def test_bad_ids_and_missing_jobs_are_named(runtime_dir):
    with pytest.raises(jobs.JobError, match="not a job id"):
        jobs.find_job("../etc")
    with pytest.raises(jobs.JobError, match="no such job"):
        jobs.find_job("j00000000")
    with pytest.raises(jobs.JobError, match="no running job"):
        jobs.find_job(None)


def test_open_directories_and_token_files_are_refused(runtime_dir):
    job = jobs.new_job()
    os.chmod(job.token_path, 0o644)
    with pytest.raises(jobs.JobError, match="not a private file"):
        job.token
    os.chmod(job.dir, 0o755)
    with pytest.raises(jobs.JobError, match="lets others in"):
        jobs.find_job(job.id)
    os.chmod(runtime_dir, 0o755)
    with pytest.raises(jobs.JobError, match="expected 0700"):
        jobs.runtime_dir()
    os.chmod(runtime_dir, 0o700)


def test_dead_jobs_are_not_alive_and_pruned(runtime_dir):
    job = jobs.new_job()
    job.socket_path.write_text("")            # a socket file nobody listens on
    info = job.info()
    info["launcher_pid"] = 2 ** 22 + 12345    # no such process
    (job.dir / jobs.INFO_NAME).write_text(__import__("json").dumps(info))
    assert not job.alive()
    assert jobs.prune() == [job.id]
    assert not job.dir.exists()


def test_launch_passes_the_tier_to_open_mpi_ranks_and_refuses_a_bad_one(runtime_dir):
    """--tier travels as $DTRACE_MK_TIER, which Open MPI forwards only when told (-x)."""
    from dtrace_mk.errors import UserError
    from dtrace_mk.launch.launcher import build_command, start_job
    argv = build_command("/x/mpirun", "openmpi", 2, ["python3", "-m", "dtrace_mk.launch.serve"], [],
                         export=("DTRACE_MK_TIER",))
    i = argv.index("DTRACE_MK_TIER")
    assert argv[i - 1] == "-x"
    assert "DTRACE_MK_TIER" not in build_command("/x/mpirun", "openmpi", 2, ["serve"], [])
    with pytest.raises(UserError, match="--tier: expected hot, compiled or auto, got 'fast'"):
        start_job(1, ["serve"], backend="sim", tier="fast")
    assert os.listdir(runtime_dir) == []           # refused before any job directory exists


def test_launch_passes_summaries_to_gpu_ranks_and_refuses_them_on_sim(runtime_dir):
    """--summaries travels as $DTRACE_MK_SUMMARIES (-x for Open MPI); device summaries on
    a sim job are refused before anything starts."""
    from dtrace_mk.errors import UserError
    from dtrace_mk.launch.launcher import build_command, start_job
    argv = build_command("/x/mpirun", "openmpi", 2, ["serve"], [], export=("DTRACE_MK_TIER", "DTRACE_MK_SUMMARIES"))
    assert argv[argv.index("DTRACE_MK_SUMMARIES") - 1] == "-x"
    with pytest.raises(UserError, match="--summaries: expected host or device, got 'gpu'"):
        start_job(1, ["serve"], backend="sim", summaries="gpu")
    with pytest.raises(UserError, match="launch --summaries device: .* this job's ranks run on the sim backend"):
        start_job(1, ["serve"], backend="sim", summaries="device")
    assert os.listdir(runtime_dir) == []


def test_open_mpi_ranks_get_the_build_log_when_it_is_set(monkeypatch):
    """$DTRACE_MK_BUILD_LOG (a GPU session's record of every kernel build: tools/kcache.py)
    reaches Open MPI ranks too (-x), and is not named when unset."""
    from dtrace_mk.launch.launcher import build_command
    monkeypatch.delenv("DTRACE_MK_BUILD_LOG", raising=False)
    assert "DTRACE_MK_BUILD_LOG" not in build_command("/x/mpirun", "openmpi", 2, ["serve"], [])
    monkeypatch.setenv("DTRACE_MK_BUILD_LOG", "/tmp/builds.jsonl")
    argv = build_command("/x/mpirun", "openmpi", 2, ["serve"], [])
    assert argv[argv.index("DTRACE_MK_BUILD_LOG") - 1] == "-x"
