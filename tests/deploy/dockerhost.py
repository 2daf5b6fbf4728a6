"""A private Docker engine for the compose test, built from nothing and leaving the host as it found it.

How it works: `DockerHost` (a context manager) records the host's iptables FORWARD policy and
/proc/sys/net/bridge/bridge-nf-call-iptables, creates a network namespace joined to the host by a veth pair
(host 10.254.<n>.1, namespace 10.254.<n>.2) and starts `dockerd` inside it (nsenter --net) with its own data root,
exec root, socket and pid file in a temporary directory. dockerd's iptables rules (FORWARD policy DROP) and its
bridge settings then live in that namespace only, so the netns partition tests and other processes on the host
never see them; compose publishes HAProxy on the namespace's address, which the host reaches over the veth.
`build_images` makes the one image every service uses: a Debian bookworm base with python3, python3-venv and
haproxy from `debootstrap --variant=minbase` (dpkg with force-unsafe-io while it runs) (or the tarball named by RAFTMQ_COMPOSE_BASE_TAR, to iterate
faster), `docker import`ed, then deploy/Dockerfile.offline installing raftmq from wheels built on the host (no
registry and no HTTPS inside the build). On exit: compose projects are taken down with their volumes, dockerd is
stopped, leftover mounts under the data root unmounted, the namespace and the directory removed, and the host
state compared with what was recorded (restored, and reported as an error, if it changed). Every phase's wall
time goes into `phases`. Needs root, dockerd, docker (any version on PATH), docker-compose and debootstrap.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parents[2]
BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
BASE_PACKAGES = "python3,python3-venv,haproxy"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_IMAGE = "raftmq-base:local"
NODE_IMAGE = "raftmq:latest"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
TOOLS = ("dockerd", "docker", "debootstrap", "nsenter", "ip")


def missing_requirements() -> list[str]:
    """What keeps the compose test from running here (it fails, naming these: it must run in CI)."""
    missing = [f"{tool} (apt-get install docker.io docker-compose debootstrap)" for tool in TOOLS
               if shutil.which(tool) is None]
    if compose_command() is None:
        missing.append("docker-compose or the docker compose plugin")
    if os.geteuid() != 0:
        missing.append("root (dockerd, network namespaces)")
    return missing


def compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True) if shutil.which("docker") else None
    return ["docker", "compose"] if probe is not None and probe.returncode == 0 else None


def host_state() -> dict[str, str]:
    """What dockerd would change on the host: the FORWARD policy and bridge-nf-call-iptables."""
    state = {"bridge_nf_call_iptables": BRIDGE_NF.read_text().strip() if BRIDGE_NF.exists() else "absent"}
    if shutil.which("iptables"):
        rules = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True).stdout.splitlines()
        state["forward_policy"] = next((line.split()[2] for line in rules if line.startswith("-P FORWARD")), "?")
    return state


def restore_host_state(recorded: dict[str, str]) -> None:
    if recorded.get("bridge_nf_call_iptables") in ("0", "1"):
        BRIDGE_NF.write_text(recorded["bridge_nf_call_iptables"])
    if recorded.get("forward_policy") in ("ACCEPT", "DROP") and shutil.which("iptables"):
        subprocess.run(["iptables", "-P", "FORWARD", recorded["forward_policy"]], check=False)


def run(argv: list[str], env: dict[str, str] | None = None, timeout_s: float = 600.0,
        cwd: Path | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-3000:]}")
    return done.stdout


class DockerHost:
    def __init__(self) -> None:
        self.tag = f"rmqc{os.getpid() % 10000}"
        self.octet = os.getpid() % 250 + 1
        self.host_address = f"10.254.{self.octet}.1"
        self.address = f"10.254.{self.octet}.2"  # the namespace's: where compose publishes ports
        self.root = Path(tempfile.mkdtemp(prefix="raftmq-compose-"))
        self.socket = self.root / "docker.sock"
        self.env = {**os.environ, "DOCKER_HOST": f"unix://{self.socket}"}
        self.phases: dict[str, float] = {}
        self.projects: list[tuple[str, list[str]]] = []
        self._recorded = host_state()
        self._dockerd: subprocess.Popen[bytes] | None = None
        self._netns = False
        self.host_state_error: str | None = None

    def __enter__(self) -> DockerHost:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def phase(self, name: str, started: float) -> None:
        self.phases[name] = round(time.monotonic() - started, 1)

    def docker(self, *args: str, timeout_s: float = 300.0) -> str:
        return run(["docker", *args], env=self.env, timeout_s=timeout_s)

    def compose(self, project: str, files: list[Path], *args: str, timeout_s: float = 300.0) -> str:
        command = compose_command()
        assert command is not None
        argv = [*command, "-p", project, *[arg for f in files for arg in ("-f", str(f))], *args]
        if (project, [str(f) for f in files]) not in self.projects:
            self.projects.append((project, [str(f) for f in files]))
        return run(argv, env=self.env, timeout_s=timeout_s, cwd=REPO)

    def _start(self) -> None:
        started = time.monotonic()
        netns = f"/run/netns/{self.tag}"
        run(["ip", "netns", "add", self.tag])
        self._netns = True
        run(["ip", "-n", self.tag, "link", "set", "lo", "up"])
        run(["ip", "link", "add", f"{self.tag}h", "type", "veth", "peer", "name", "eth0", "netns", self.tag])
        run(["ip", "addr", "add", f"{self.host_address}/30", "dev", f"{self.tag}h"])
        run(["ip", "link", "set", f"{self.tag}h", "up"])
        run(["ip", "-n", self.tag, "addr", "add", f"{self.address}/30", "dev", "eth0"])
        run(["ip", "-n", self.tag, "link", "set", "eth0", "up"])
        run(["ip", "-n", self.tag, "route", "add", "default", "via", self.host_address])
        log = open(self.root / "dockerd.log", "wb")  # noqa: SIM115 (kept open for the daemon's lifetime)
        self._dockerd = subprocess.Popen(
            ["nsenter", f"--net={netns}", "dockerd", "--data-root", str(self.root / "data"),
             "--exec-root", str(self.root / "exec"), "-H", f"unix://{self.socket}",
             "--pidfile", str(self.root / "docker.pid")],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while subprocess.run(["docker", "version"], env=self.env, capture_output=True).returncode != 0:
            if self._dockerd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start:\n{(self.root / 'dockerd.log').read_text()[-3000:]}")
            time.sleep(0.3)
        self.phase("dockerd start", started)

    def build_images(self) -> None:
        """The base image (debootstrap, or RAFTMQ_COMPOSE_BASE_TAR) and the node image, wheels built meanwhile."""
        context = self.root / "context"
        started = time.monotonic()
        base_tar = os.environ.get("RAFTMQ_COMPOSE_BASE_TAR")
        rootfs = self.root / "rootfs"
        speedup = rootfs / "etc" / "dpkg" / "dpkg.cfg.d" / "unsafe-io"  # dpkg without an fsync per file (as
        speedup.parent.mkdir(parents=True)  # Debian's own container images do); removed before the import
        speedup.write_text("force-unsafe-io\n")
        bootstrap = None if base_tar else subprocess.Popen(
            ["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm", str(rootfs),
             DEBIAN_MIRROR], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        run([sys.executable, "-m", "pip", "wheel", "-q", str(REPO), "-w", str(context / "wheels")], cwd=self.root)
        self.phase("wheels (during debootstrap)", started)
        if bootstrap is not None:
            out, _ = bootstrap.communicate(timeout=900)
            if bootstrap.returncode != 0:
                raise RuntimeError(f"debootstrap failed:\n{out.decode(errors='replace')[-3000:]}")
            speedup.unlink()
            self.phase("debootstrap", started)
        started = time.monotonic()
        if base_tar:
            self.docker("import", base_tar, BASE_IMAGE)
        else:
            tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
            done = subprocess.run(["docker", "import", "-", BASE_IMAGE], stdin=tar.stdout, env=self.env,
                                  capture_output=True, text=True, timeout=300)
            assert tar.stdout is not None
            tar.stdout.close()
            if tar.wait() != 0 or done.returncode != 0:
                raise RuntimeError(f"docker import failed: {done.stderr}")
            shutil.rmtree(rootfs, ignore_errors=True)
        self.phase("docker import", started)
        started = time.monotonic()
        shutil.copy(REPO / "deploy" / "Dockerfile.offline", context / "Dockerfile")
        self.docker("build", "-q", "--build-arg", f"BASE={BASE_IMAGE}", "-t", NODE_IMAGE, str(context),
                    timeout_s=600)
        self.phase("image build", started)

    def close(self) -> None:
        started = time.monotonic()
        for project, files in reversed(self.projects):
            with contextlib.suppress(Exception):
                self.compose(project, [Path(f) for f in files], "down", "-v", "--timeout", "0")
        if self._dockerd is not None and self._dockerd.poll() is None:
            self._dockerd.send_signal(signal.SIGTERM)  # dockerd stops its containerd itself
            try:
                self._dockerd.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self._dockerd.pid, signal.SIGKILL)
                self._dockerd.wait(timeout=10)
        self._unmount_under_root()
        if self._netns:
            subprocess.run(["ip", "netns", "delete", self.tag], check=False)
            self._netns = False
        shutil.rmtree(self.root, ignore_errors=True)
        now = host_state()
        if now != self._recorded:
            self.host_state_error = f"the host changed: {self._recorded} before, {now} after (restored)"
            restore_host_state(self._recorded)
        self.phase("down", started)

    def _unmount_under_root(self) -> None:
        prefix = str(self.root)
        with open("/proc/self/mountinfo") as mounts:
            points = [line.split()[4] for line in mounts if line.split()[4].startswith(prefix)]
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)
