"""The auto_resume SPANK plugin, exercised through the real sbatch, srun and salloc.

The local cluster loads spank_plugin/auto_resume.so with
``statedir=<dir>/autoresume progress_root=<progress root>/%n memory_root=<memory root>/%n
checkpoint_root=<dir>/checkpoints`` and a job_submit.lua that copies AUTO_RESUME from the
job-control environment into admin_comment. Jobs whose directories matter run as an
unprivileged user (tests/integration/hostile.py). The build tests at the end need only a
C compiler and spank.h.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hostile import User, user_env, victim

PLUGIN_SRC = Path(__file__).resolve().parents[2] / "spank_plugin"
TIMEOUT = 30.0
BAD_VALUES = ["abc", "-1", "99999", "", "1.5", "+1", " 1"]


def run(
    argv: list[str], env: dict[str, str], timeout: float = TIMEOUT, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False
    )


class Jobs:
    """Submits jobs on the cluster and cancels whatever is left at the end."""

    def __init__(self, cluster: Any):
        self.dir = Path(cluster.dir)
        self.env: dict[str, str] = {
            k: v for k, v in cluster.env.items() if not k.startswith("HYPERPOD_")
        }
        self.ids: list[str] = []
        # A directory of this test's own: job ids start again with every new cluster,
        # and an output file left by an earlier one must never pass for this job's.
        self.out = self.dir / "out" / uuid.uuid4().hex
        self.out.mkdir(parents=True)

    def sbatch(self, *args: str, script: str) -> str:
        out = self.out / "%j.out"
        res = run(
            ["sbatch", "--parsable", "-N1", "-o", str(out), *args, "--wrap", script], self.env
        )
        assert res.returncode == 0, res.stderr
        job = res.stdout.strip().split(";")[0]
        self.ids.append(job)
        return job

    def wait_done(self, job: str, timeout: float = TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.field(job, "JobState")
            if state in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}:
                return state
            time.sleep(0.2)
        raise AssertionError(f"job {job} did not finish within {timeout} s")

    def output(self, job: str) -> str:
        assert self.wait_done(job) == "COMPLETED", self.show(job)
        return (self.out / f"{job}.out").read_text()

    def show(self, job: str) -> str:
        res = run(["scontrol", "show", "job", "-o", job], self.env)
        assert res.returncode == 0, res.stderr
        return res.stdout

    def field(self, job: str, name: str) -> str | None:
        # -o prints one line of Key=Value pairs; the values read here hold no spaces.
        m = re.search(rf"(?:^| ){name}=(\S*)", self.show(job))
        return m.group(1) if m else None

    def marker(self, job: str) -> Path:
        return self.dir / "autoresume" / job

    def cancel_all(self) -> None:
        if self.ids:
            run(["scancel", *self.ids], self.env)


@pytest.fixture
def jobs(local_cluster: Any) -> Iterator[Jobs]:
    j = Jobs(local_cluster)
    try:
        yield j
    finally:
        j.cancel_all()


def plugin_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "auto-resume: " in line]


# --- where the value shows up -------------------------------------------------------


@pytest.mark.slurm
def test_sbatch_flag_reaches_tasks_admin_comment_and_checkpoint_dir(jobs: Jobs) -> None:
    job = jobs.sbatch(
        "--auto-resume=1",
        script=("srun sh -c 'echo \"ar=$HYPERPOD_AUTO_RESUME ckpt=$HYPERPOD_CHECKPOINT_DIR\"'"),
    )
    out = jobs.output(job)
    ckpt = jobs.dir / "checkpoints" / job
    assert out.strip() == f"ar=1 ckpt={ckpt}"
    assert jobs.field(job, "AdminComment") == "auto_resume=1"


@pytest.mark.slurm
def test_srun_only_job_gets_admin_comment_and_task_env(jobs: Jobs) -> None:
    res = run(
        [
            "srun",
            "--auto-resume=3",
            "-N1",
            "sh",
            "-c",
            'echo "$SLURM_JOB_ID $HYPERPOD_AUTO_RESUME"',
        ],
        jobs.env,
    )
    assert res.returncode == 0, res.stderr
    job, value = res.stdout.split()
    jobs.ids.append(job)
    assert value == "3"
    assert jobs.field(job, "AdminComment") == "auto_resume=3"
    assert jobs.marker(job).read_text().startswith("auto_resume=3 step=0 node=node")


@pytest.mark.slurm
def test_srun_inside_batch_script_writes_marker(jobs: Jobs) -> None:
    job = jobs.sbatch(script="srun --auto-resume=1 printenv HYPERPOD_AUTO_RESUME")
    assert jobs.output(job).strip() == "1"
    # job_submit never saw the flag: only the marker tells the node agent.
    assert jobs.field(job, "AdminComment") is None
    marker = jobs.marker(job)
    assert re.fullmatch(r"auto_resume=1 step=0 node=node\d+\n", marker.read_text())
    assert stat.S_IMODE(marker.stat().st_mode) == 0o644
    assert not list(marker.parent.glob(f".{job}.*")), "temporary file left behind"


@pytest.mark.slurm
def test_salloc_flag_reaches_admin_comment(jobs: Jobs) -> None:
    res = run(["salloc", "--auto-resume=2", "--no-shell", "-N1"], jobs.env)
    assert res.returncode == 0, res.stderr
    m = re.search(r"Granted job allocation (\d+)", res.stderr)
    assert m, res.stderr
    jobs.ids.append(m.group(1))
    assert jobs.field(m.group(1), "AdminComment") == "auto_resume=2"


@pytest.mark.slurm
def test_bare_flag_means_one_and_reaches_sruns_inside_the_job(jobs: Jobs) -> None:
    # Slurm forwards a bare option to the job's sruns as "(null)": they must accept it.
    job = jobs.sbatch("--auto-resume", script="srun printenv HYPERPOD_AUTO_RESUME")
    assert jobs.output(job).strip() == "1"
    assert jobs.field(job, "AdminComment") == "auto_resume=1"


@pytest.mark.slurm
def test_bare_flag_does_not_swallow_the_command(jobs: Jobs) -> None:
    res = run(["srun", "--auto-resume", "-N1", "printenv", "HYPERPOD_AUTO_RESUME"], jobs.env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "1"


@pytest.mark.slurm
def test_zero_opts_out_without_checkpoint_dir(jobs: Jobs) -> None:
    job = jobs.sbatch(
        "--auto-resume=0",
        script=(
            "srun sh -c 'echo \"ar=$HYPERPOD_AUTO_RESUME ckpt=${HYPERPOD_CHECKPOINT_DIR-unset}\"'"
        ),
    )
    assert jobs.output(job).strip() == "ar=0 ckpt=unset"
    assert jobs.field(job, "AdminComment") == "auto_resume=0"


@pytest.mark.slurm
def test_checkpoint_dir_set_by_the_job_wins(jobs: Jobs) -> None:
    job = jobs.sbatch(
        "--auto-resume=1",
        "--export=ALL,HYPERPOD_CHECKPOINT_DIR=/data/mine",
        script="srun printenv HYPERPOD_CHECKPOINT_DIR",
    )
    assert jobs.output(job).strip() == "/data/mine"


# --- the job key: a reused job id never finds the old job's checkpoints --------------

KEY_LINE = "srun sh -c 'echo \"key=${SLURM_SPANK_HYPERPOD_JOB_KEY-unset} bound=${HYPERPOD_CHECKPOINT_JOB_KEY-unset}\"'"  # noqa: E501
KEY_RE = re.compile(r"key=([0-9a-f]{32}) bound=(\S+)")


@pytest.mark.slurm
def test_every_job_gets_its_own_key_bound_to_its_checkpoint_dir(jobs: Jobs) -> None:
    keys = []
    for _ in range(2):
        job = jobs.sbatch("--auto-resume=1", script=KEY_LINE)
        m = KEY_RE.fullmatch(jobs.output(job).strip())
        assert m, jobs.output(job)
        assert m.group(2) == m.group(1), "the key comes with <checkpoint_root>/<jobid>"
        keys.append(m.group(1))
    assert keys[0] != keys[1]


@pytest.mark.slurm
def test_a_job_without_the_flag_gets_a_key_for_sruns_with_it(jobs: Jobs) -> None:
    # HyperPod's idiom: the flag on the srun inside the script. The key was made at
    # submission, so every run of the script (a requeue) sees the same one.
    job = jobs.sbatch(
        script="srun --auto-resume=1 sh -c 'echo \"key=$SLURM_SPANK_HYPERPOD_JOB_KEY "
        "bound=$HYPERPOD_CHECKPOINT_JOB_KEY\"'"
    )
    m = KEY_RE.fullmatch(jobs.output(job).strip())
    assert m and m.group(2) == m.group(1), jobs.output(job)


@pytest.mark.slurm
def test_a_directory_the_job_chose_gets_no_job_key(jobs: Jobs) -> None:
    # A chain of jobs sharing one directory must not be refused its own checkpoints.
    job = jobs.sbatch(
        "--auto-resume=1", "--export=ALL,HYPERPOD_CHECKPOINT_DIR=/data/mine", script=KEY_LINE
    )
    m = KEY_RE.fullmatch(jobs.output(job).strip())
    assert m and m.group(2) == "unset", jobs.output(job)


@pytest.mark.slurm
def test_srun_only_job_tasks_get_the_key(jobs: Jobs) -> None:
    res = run(
        [
            "srun",
            "--auto-resume=1",
            "-N1",
            "sh",
            "-c",
            'echo "$SLURM_JOB_ID key=$SLURM_SPANK_HYPERPOD_JOB_KEY '
            'bound=$HYPERPOD_CHECKPOINT_JOB_KEY"',
        ],
        jobs.env,
    )
    assert res.returncode == 0, res.stderr
    job, line = res.stdout.strip().split(" ", 1)
    jobs.ids.append(job)
    m = KEY_RE.fullmatch(line)
    assert m and m.group(2) == m.group(1), res.stdout


@pytest.mark.slurm
def test_the_job_key_survives_a_requeue(jobs: Jobs) -> None:
    job = jobs.sbatch(
        "--auto-resume=1",
        "--requeue",
        "--open-mode=append",
        script=(
            "srun sh -c 'echo \"restart=${SLURM_RESTART_COUNT:-0} "
            "key=$SLURM_SPANK_HYPERPOD_JOB_KEY bound=$HYPERPOD_CHECKPOINT_JOB_KEY\"'; "
            '[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || sleep 120'
        ),
    )
    out = jobs.out / f"{job}.out"
    deadline = time.monotonic() + TIMEOUT
    while not (out.exists() and "restart=0" in out.read_text()):
        assert time.monotonic() < deadline, "the first run did not start"
        time.sleep(0.2)
    res = run(["scontrol", "requeue", job], jobs.env)
    assert res.returncode == 0, res.stderr
    assert jobs.wait_done(job, timeout=120) == "COMPLETED", jobs.show(job)
    lines = out.read_text().split("\n")
    runs = [re.fullmatch(r"restart=(\d+) key=([0-9a-f]{32}) bound=(\S+)", x) for x in lines if x]
    assert [m.group(1) for m in runs if m] == ["0", "1"], lines
    assert len({(m.group(2), m.group(3)) for m in runs if m}) == 1, "one key for every run"


@pytest.mark.slurm
def test_job_without_flag_has_no_trace(jobs: Jobs) -> None:
    job = jobs.sbatch(script="srun env")
    out = jobs.output(job)
    assert "HYPERPOD_AUTO_RESUME" not in out
    assert "HYPERPOD_CHECKPOINT_DIR" not in out
    assert jobs.field(job, "AdminComment") is None
    assert not jobs.marker(job).exists()


# --- the job's own directories: made by slurmstepd for the job's user ----------------

NOBODY = 65534
DIRS_LINE = (
    "srun sh -c 'echo node=$(hostname) key=${HYPERPOD_CHECKPOINT_JOB_KEY-}; "
    'for d in "$HYPERPOD_PROGRESS_DIR/$SLURM_JOB_ID" "$HYPERPOD_CHECKPOINT_MEMORY_DIR" '
    '"$HYPERPOD_CHECKPOINT_DIR"; do stat -c "%n %u %a" "$d"; done\''
)


def _next_job_id(jobs: Jobs) -> int:
    """The id of the next job: nothing else submits on this cluster meanwhile."""
    res = run(["sbatch", "--parsable", "--hold", "-N1", "--wrap", "true"], jobs.env)
    assert res.returncode == 0, res.stderr
    held = res.stdout.strip().split(";")[0]
    run(["scancel", held], jobs.env)
    return int(held) + 1


def _sbatch_as(user: User, cluster: Any, jobs: Jobs, *args: str, script: str) -> str:
    out = jobs.out / user.name
    out.mkdir(exist_ok=True)
    shutil.chown(out, user.uid, user.gid)
    res = user.run(
        ["sbatch", "--parsable", "-N1", "-o", str(out / "%j.out"), *args, "--wrap", script],
        user_env(cluster.env, Path("/usr/bin")),
    )
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    jobs.ids.append(job)
    return job


def _user_output(jobs: Jobs, user: User, job: str) -> str:
    assert jobs.wait_done(job) == "COMPLETED", jobs.show(job)
    return (jobs.out / user.name / f"{job}.out").read_text()


def _owner_mode(path: Path) -> tuple[int, int]:
    st = path.lstat()
    return st.st_uid, stat.S_IMODE(st.st_mode)


@pytest.mark.slurm
def test_a_job_gets_private_directories_of_its_user_removed_after_it(
    local_cluster: Any, jobs: Jobs
) -> None:
    user = victim()
    job = _sbatch_as(user, local_cluster, jobs, "--auto-resume=1", script=DIRS_LINE)
    lines = _user_output(jobs, user, job).splitlines()
    node = lines[0].split()[0].removeprefix("node=")
    shape = local_cluster.shape
    progress = shape.progress_root / node / job
    memory = shape.memory_root / node / job
    ckpt = local_cluster.dir / "checkpoints" / job
    assert lines[1:] == [f"{d} {user.uid} 700" for d in (progress, memory, ckpt)]
    # the epilog: progress records of a run that is over go, an empty memory tier goes;
    # the checkpoints are the job's
    assert not progress.exists() and not memory.exists()
    assert _owner_mode(ckpt) == (user.uid, 0o700)


@pytest.mark.slurm
def test_a_directory_someone_else_made_first_is_left_alone_and_the_job_runs(
    local_cluster: Any, jobs: Jobs
) -> None:
    user = victim()
    job = str(_next_job_id(jobs))
    shape = local_cluster.shape
    ckpt_root = local_cluster.dir / "checkpoints"
    squatted = [ckpt_root / job] + [
        root / node / job
        for root in (shape.progress_root, shape.memory_root)
        for node in shape.all_names
    ]
    for d in squatted:  # another user, first: the next job's names in the 1777 roots
        d.mkdir(mode=0o755)
        os.chown(d, NOBODY, NOBODY)
    assert _sbatch_as(user, local_cluster, jobs, "--auto-resume=1", script=DIRS_LINE) == job
    out = _user_output(jobs, user, job)
    lines = out.splitlines()
    m = next(filter(None, (re.fullmatch(r"node=(\S+) key=([0-9a-f]{32})", x) for x in lines)))
    node, key = m.groups()
    # the checkpoints go to the directory named after the job's key; the rest is off
    fallback = ckpt_root / f"{job}.{key}"
    assert f"{fallback} {user.uid} 700" in lines, out
    notes = plugin_errors(out)
    for what, path, then in [
        ("progress directory", shape.progress_root / node / job, "progress records are off"),
        ("memory tier directory", shape.memory_root / node / job, "memory tier is off"),
        ("checkpoint directory", ckpt_root / job, f"this job checkpoints to {fallback}"),
    ]:
        mine = [n for n in notes if f"couldn't make {what} {path}: belongs to uid {NOBODY}" in n]
        assert mine and all(then in n for n in mine), out
    # never adopted, never chowned, never removed
    assert all(_owner_mode(d) == (NOBODY, 0o755) for d in squatted)
    assert all(not any(d.iterdir()) for d in squatted)


# --- rejection of bad input ---------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.parametrize("value", BAD_VALUES)
@pytest.mark.parametrize(
    "command",
    [
        ["sbatch", "--wrap", "true"],
        ["srun", "-N1", "true"],
        ["salloc", "--no-shell", "-N1"],
    ],
)
def test_invalid_value_is_rejected_with_one_line(
    jobs: Jobs, command: list[str], value: str
) -> None:
    argv = [command[0], f"--auto-resume={value}", *command[1:]]
    res = run(argv, jobs.env)
    assert res.returncode != 0
    ours = plugin_errors(res.stderr)
    assert len(ours) == 1, res.stderr
    assert ours[0].endswith(f"couldn't parse --auto-resume={value}: want an integer 0..1000")
    assert "Granted job allocation" not in res.stderr
    assert res.stdout == ""


@pytest.mark.slurm
@pytest.mark.parametrize("command", ["sbatch", "srun", "salloc"])
def test_help_lists_the_option(jobs: Jobs, command: str) -> None:
    res = run([command, "--help"], jobs.env)
    assert res.returncode == 0, res.stderr
    assert "--auto-resume=N" in res.stdout


def _conf_with_plugstack(cluster: Any, tmp_path: Path, args: str) -> dict[str, str]:
    """A copy of the cluster's slurm.conf whose plugstack.conf passes ``args``.
    Only the client reads it; the daemons keep their own configuration."""
    plugstack = tmp_path / "plugstack.conf"
    plugstack.write_text(f"required {cluster.dir}/lib/auto_resume.so {args}\n")
    conf = Path(cluster.slurm_conf).read_text()
    conf = re.sub(r"(?m)^PlugStackConfig=.*$", f"PlugStackConfig={plugstack}", conf)
    (tmp_path / "slurm.conf").write_text(conf)
    env = dict(cluster.env)
    env["SLURM_CONF"] = str(tmp_path / "slurm.conf")
    return env


@pytest.mark.slurm
@pytest.mark.parametrize(
    ("args", "why"),
    [
        ("bogus=1", "'bogus=1': unknown key"),
        ("statedir", "'statedir': want statedir=VALUE"),
        ("statedir=relative/dir", "'statedir=relative/dir': want an absolute path"),
        ("checkpoint_root=x", "'checkpoint_root=x': want an absolute path or s3://bucket[/prefix]"),
        ("progress_root=shm", "'progress_root=shm': want an absolute path"),
        (
            "memory_root=/dev/shm/%h",
            "'memory_root=/dev/shm/%h': want an absolute path (%n, the node's host name, "
            "is the only substitution)",
        ),
        ("progress_root=/a progress_root=/b", "'progress_root=/b': progress_root= given twice"),
        ("checkpoint_root=", "'checkpoint_root=': want an absolute path or s3://bucket[/prefix]"),
        (
            "checkpoint_root=s3://Bad/x",
            "'checkpoint_root=s3://Bad/x': want an absolute path or s3://bucket[/prefix]",
        ),
        (
            "checkpoint_root=s3://ckpt/../x",
            "'checkpoint_root=s3://ckpt/../x': want an absolute path or s3://bucket[/prefix]",
        ),
        (
            "checkpoint_root=s3://ckpt/",
            "'checkpoint_root=s3://ckpt/': want an absolute path or s3://bucket[/prefix]",
        ),
        ("max=abc", "'max=abc': want an integer 0..1000000"),
        ("max=-1", "'max=-1': want an integer 0..1000000"),
        ("default=x", "'default=x': want an integer 0..1000000"),
        ("max=3 default=4", "'default=4': larger than max=3"),
        ("max=3 max=4", "'max=4': max= given twice"),
    ],
)
def test_bad_plugstack_argument_stops_the_plugin(
    local_cluster: Any, tmp_path: Path, args: str, why: str
) -> None:
    env = _conf_with_plugstack(local_cluster, tmp_path, args)
    res = run(["sbatch", "--auto-resume=1", "--wrap", "true"], env)
    assert res.returncode != 0
    ours = plugin_errors(res.stderr)
    assert len(ours) == 1, res.stderr
    assert f"auto-resume: allocator: couldn't parse plugstack argument {why}" in ours[0]


@pytest.mark.slurm
@pytest.mark.parametrize("root", ["s3://ckpt", "s3://ckpt/jobs/team-a"])
def test_an_object_store_checkpoint_root_is_accepted(
    local_cluster: Any, tmp_path: Path, root: str
) -> None:
    env = _conf_with_plugstack(local_cluster, tmp_path, f"checkpoint_root={root}")
    res = run(["sbatch", "--parsable", "--auto-resume=1", "--wrap", "true"], env)
    assert res.returncode == 0, res.stderr
    assert plugin_errors(res.stderr) == []
    run(["scancel", res.stdout.strip().split(";")[0]], env)


@pytest.mark.slurm
def test_max_argument_lowers_the_limit(local_cluster: Any, tmp_path: Path) -> None:
    env = _conf_with_plugstack(local_cluster, tmp_path, "max=5 default=2")
    res = run(["srun", "--auto-resume=6", "-N1", "true"], env)
    assert res.returncode != 0
    assert plugin_errors(res.stderr)[0].endswith(
        "couldn't parse --auto-resume=6: want an integer 0..5"
    )


# --- build --------------------------------------------------------------------------


def _copy_source(tmp_path: Path) -> Path:
    src = tmp_path / "spank_plugin"
    (src / "test").mkdir(parents=True)
    for name in ("auto_resume.c", "jobdirs.c", "jobdirs.h", "exports.map", "Makefile"):
        shutil.copy(PLUGIN_SRC / name, src / name)
    shutil.copy(PLUGIN_SRC / "test" / "check.c", src / "test" / "check.c")
    return src


def test_plugin_checks_pass_under_sanitizers(tmp_path: Path) -> None:
    # Its parsing and its directories without Slurm, under ASan and UBSan: an argument
    # is never read past its end (checkpoint_root=x), a directory someone else made is
    # never used, chowned or removed.
    src = _copy_source(tmp_path)
    res = run(["make", "-C", str(src), "check"], {"PATH": "/usr/bin:/bin"}, 300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"\d+ checks, 0 failed", res.stdout), res.stdout
    assert "skipped" not in res.stdout or os.geteuid() != 0


def test_build_exports_only_spank_symbols(tmp_path: Path) -> None:
    src = _copy_source(tmp_path)
    res = run(["make", "-C", str(src), "check-symbols"], {"PATH": "/usr/bin:/bin"}, 120)
    assert res.returncode == 0, res.stderr
    nm = run(["nm", "-D", "--defined-only", str(src / "auto_resume.so")], {}, 10)
    names = {line.split()[-1] for line in nm.stdout.splitlines()}
    assert {
        "slurm_spank_init",
        "slurm_spank_init_post_opt",
        "slurm_spank_task_init",
        "slurm_spank_job_epilog",
        "plugin_name",
        "plugin_type",
        "plugin_version",
        "spank_plugin_version",
    } == names


def _add_global_helper(src: Path) -> None:
    with (src / "auto_resume.c").open("a") as f:
        f.write("int ar_global_helper(void);\nint ar_global_helper(void) { return 0; }\n")


def test_export_map_hides_non_static_functions(tmp_path: Path) -> None:
    src = _copy_source(tmp_path)
    _add_global_helper(src)
    res = run(["make", "-C", str(src), "check-symbols"], {"PATH": "/usr/bin:/bin"}, 120)
    assert res.returncode == 0, res.stderr


def test_check_symbols_fails_on_a_leaking_export_map(tmp_path: Path) -> None:
    src = _copy_source(tmp_path)
    _add_global_helper(src)
    (src / "exports.map").write_text("{ global: *; };\n")
    res = run(["make", "-C", str(src), "check-symbols"], {"PATH": "/usr/bin:/bin"}, 120)
    assert res.returncode != 0
    assert "unexpected exported symbols: ar_global_helper" in res.stderr


def test_build_is_hardened_and_installs(tmp_path: Path) -> None:
    src = _copy_source(tmp_path)
    env = {"PATH": "/usr/bin:/bin"}
    res = run(
        ["make", "-C", str(src), "install", f"DESTDIR={tmp_path}/root", "LIBDIR=/usr/lib/slurm"],
        env,
        120,
    )
    assert res.returncode == 0, res.stderr
    installed = tmp_path / "root/usr/lib/slurm/auto_resume.so"
    assert stat.S_IMODE(installed.stat().st_mode) == 0o755
    dynamic = run(["readelf", "-d", str(installed)], env, 10).stdout
    assert "BIND_NOW" in dynamic
    assert "GNU_RELRO" in run(["readelf", "-lW", str(installed)], env, 10).stdout
    assert "__stack_chk_fail" in run(["nm", "-D", str(installed)], env, 10).stdout
    res = run(["make", "-C", str(src), "clean"], env, 30)
    assert res.returncode == 0 and not (src / "auto_resume.so").exists()
