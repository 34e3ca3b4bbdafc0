"""The fake scheduler and kubelet: ``Kubelet`` binds pods onto the single fake node and runs
each pod's first container as a local process (``PodRuntime``), expanding ``$(VAR)``
references, enforcing memory limits, grace periods and deadlines and reporting pod status.
Part of the in-repo FAKE Kubernetes core/v1 API used by tests (see ``fake_kube``); NOT a
real cluster.
"""
from __future__ import annotations

import copy
import hashlib
import logging
import os
import re
import signal
import subprocess
import threading
import time
from decimal import Decimal
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import psutil

from .objects import (GPU, HOST_IP, NODE_LABELS, NODE_NAME, POD_IP, _UNSCHEDULABLE_TAIL, _now,
                      _ts, parse_quantity)
from .store import pod_requests

if TYPE_CHECKING:  # only for annotations; cluster imports this module
    from .cluster import FakeKubeCluster

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------
# The fake kubelet: one worker thread per pod bound to the node
# --------------------------------------------------------------------------------------
class ConfigError(Exception):
    """The container cannot be configured yet (a missing secret or key, no command)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


_VAR_REF = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def expand_vars(text: str, env: Dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: unknown references stay, ``$$`` escapes ``$``."""
    def replace(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return _VAR_REF.sub(replace, text)


class PodRuntime:
    """What the fake kubelet knows of one pod bound to the node.

    The worker thread owns the process; API threads only set the ``deleting``/``evicted``
    requests, signal the process tree and wake the worker (all under the cluster lock).
    """

    def __init__(self, pod: dict, log_dir: str) -> None:
        meta = pod["metadata"]
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.spec: dict = pod["spec"]
        self.container: dict = pod["spec"]["containers"][0]
        self.requests = pod_requests(pod)
        self.log_dir = log_dir
        self.wake = threading.Event()
        self.thread: Optional[threading.Thread] = None
        self.proc: Optional[subprocess.Popen] = None
        self.ps: Optional[psutil.Process] = None
        self.tree: Dict[int, psutil.Process] = {}
        self.group_released = True  # the process group id may no longer be ours
        self.deleting = False
        self.kill_at: Optional[float] = None
        self.evicted: Optional[str] = None
        self.oom = False
        self.deadline_exceeded = False
        self.done = False
        self.attempts = 0
        self.finished_attempts = 0
        self.active_since = time.monotonic()
        # what the kubelet reports
        self.phase = "Pending"
        self.state: dict = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict = {}
        self.restart_count = 0
        self.ready = False
        self.started = False
        self.image_id = ""
        self.container_id: Optional[str] = None
        self.start_time = _now()
        self.pod_ip: Optional[str] = None
        self.reason: Optional[str] = None
        self.message: Optional[str] = None
        self.transitions: Dict[str, Tuple[str, str]] = {}

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def stop_requested(self) -> bool:
        return self.deleting or self.evicted is not None

    def log_path(self, attempt: int) -> str:
        return os.path.join(self.log_dir, f"{attempt}.log")

    def sleep(self, seconds: Optional[float]) -> bool:
        """Wait up to ``seconds`` (None: forever); True when the pod must stop."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while not self.stop_requested:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self.wake.wait(remaining)
            self.wake.clear()
        return True


class Kubelet:
    """The fake scheduler and kubelet of the single node ``fake-node`` (process mode)."""

    def __init__(self, cluster: "FakeKubeCluster") -> None:
        self.cluster = cluster
        self.lock = cluster.cond
        self.runtimes: Dict[str, PodRuntime] = {}
        self.unbound: Dict[str, Tuple[str, str]] = {}
        self.stopping = False

    # -- scheduling ---------------------------------------------------------------------
    def capacity(self) -> Dict[str, Decimal]:
        """The node's allocatable resources."""
        cluster = self.cluster
        out = {"cpu": parse_quantity(cluster.node_cpu),
               "memory": parse_quantity(cluster.node_memory),
               "pods": Decimal(cluster.node_pods), "ephemeral-storage": parse_quantity("100Gi")}
        if cluster.node_gpus:
            out[GPU] = Decimal(cluster.node_gpus)
        return out

    def free(self) -> Dict[str, Decimal]:
        """Allocatable minus the requests of the bound pods that have not finished."""
        free = self.capacity()
        for rt in self.runtimes.values():
            if not rt.terminal:
                free["pods"] -= 1
                for name, amount in rt.requests.items():
                    free[name] = free.get(name, Decimal(0)) - amount
        return free

    def add(self, pod: dict) -> None:
        """A new pod to schedule (in creation order)."""
        self.unbound[pod["metadata"]["uid"]] = (pod["metadata"]["namespace"],
                                                pod["metadata"]["name"])

    def schedule(self) -> None:
        """Bind every unbound pod that fits; mark the others Unschedulable."""
        with self.lock:
            if self.stopping:
                return
            free = self.free()
            for uid, (ns, name) in list(self.unbound.items()):
                pod = self.cluster.store.get("Pod", ns, name)
                if pod is None or pod["metadata"]["uid"] != uid:
                    del self.unbound[uid]
                    continue
                requests = pod_requests(pod)
                node_name = pod["spec"].get("nodeName")
                if node_name and node_name != NODE_NAME:
                    continue  # bound by the client to a node that does not exist: Pending
                missing = [] if node_name else self._misfits(pod, requests, free)
                if missing:
                    self._mark_unschedulable(pod, missing)
                    continue
                for r, amount in requests.items():
                    free[r] = free.get(r, Decimal(0)) - amount
                free["pods"] -= 1
                del self.unbound[uid]
                self._bind(pod)

    @staticmethod
    def _misfits(pod: dict, requests: Dict[str, Decimal], free: Dict[str, Decimal]) -> List[str]:
        """Why the pod does not fit the node, as kube-scheduler words it (empty: it fits)."""
        selector = pod["spec"].get("nodeSelector") or {}
        if any(NODE_LABELS.get(k) != v for k, v in selector.items()):
            return ["1 node(s) didn't match Pod's node affinity/selector"]
        missing = [f"1 Insufficient {r}" for r, amount in sorted(requests.items())
                   if amount > free.get(r, Decimal(0))]
        return missing + (["1 Too many pods"] if free["pods"] < 1 else [])

    def _mark_unschedulable(self, pod: dict, missing: List[str]) -> None:
        reasons = ", ".join(missing)
        message = f"0/1 nodes are available: {reasons}{_UNSCHEDULABLE_TAIL}"
        current = [c for c in pod["status"].get("conditions") or []
                   if c.get("type") == "PodScheduled"]
        if current and current[0].get("message") == message:
            return
        new = copy.deepcopy(pod)
        new["status"]["conditions"] = [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message, "lastProbeTime": None, "lastTransitionTime": _now()}]
        self.cluster.store.replace(new)

    def _bind(self, pod: dict) -> None:
        new = copy.deepcopy(pod)
        new["spec"]["nodeName"] = NODE_NAME
        new["status"]["conditions"] = [{"type": "PodScheduled", "status": "True",
                                        "lastProbeTime": None, "lastTransitionTime": _now()}]
        pod = self.cluster.store.replace(new)
        log_dir = os.path.join(self.cluster.workdir, "logs",
                               f"{pod['metadata']['namespace']}_{pod['metadata']['name']}_"
                               f"{pod['metadata']['uid']}")
        os.makedirs(log_dir, exist_ok=True)
        rt = PodRuntime(pod, log_dir)
        rt.transitions["PodScheduled"] = ("True", _now())
        self.runtimes[rt.uid] = rt
        rt.thread = threading.Thread(target=self._worker, args=(rt,), daemon=True,
                                     name=f"fake-kubelet-{rt.name}")
        rt.thread.start()

    # -- requests from the API and the test hooks ---------------------------------------
    def runtime(self, uid: str) -> Optional[PodRuntime]:
        with self.lock:
            return self.runtimes.get(uid)

    def forget(self, uid: str) -> None:
        """The pod left the store: stop counting it and stop its process if it still runs."""
        with self.lock:
            self.unbound.pop(uid, None)
            rt = self.runtimes.pop(uid, None)
            if rt is not None and not rt.done:
                self.request_stop(rt, 0)

    def request_stop(self, rt: PodRuntime, grace: int) -> None:
        """Deletion: SIGTERM the process tree now, SIGKILL it after ``grace`` seconds."""
        with self.lock:
            rt.deleting = True
            deadline = time.monotonic() + grace
            rt.kill_at = deadline if rt.kill_at is None else min(rt.kill_at, deadline)
            if grace <= 0:
                self._kill_tree(rt)
            else:
                self._terminate(rt)
            rt.wake.set()

    def evict(self, rt: PodRuntime, message: str) -> None:
        """Node-pressure eviction: kill the process tree, then report Failed/Evicted."""
        with self.lock:
            if rt.terminal or rt.done:
                return
            rt.evicted = message
            self._kill_tree(rt)
            rt.wake.set()

    def stop_all(self, timeout: float = 10.0) -> None:
        """Kill every pod's process tree and wait for the workers to end."""
        with self.lock:
            self.stopping = True
            runtimes = list(self.runtimes.values())
            for rt in runtimes:
                rt.deleting = True
                rt.kill_at = time.monotonic()
                self._kill_tree(rt)
                rt.wake.set()
        deadline = time.monotonic() + timeout
        for rt in runtimes:
            if rt.thread is not None:
                rt.thread.join(max(0.0, deadline - time.monotonic()))
            self._kill_tree(rt)
            if rt.thread is not None and rt.thread.is_alive():
                logger.warning("fake kubelet: worker of pod %s/%s did not stop",
                               rt.namespace, rt.name)

    # -- the worker ---------------------------------------------------------------------
    def _worker(self, rt: PodRuntime) -> None:
        try:
            self._publish(rt)
            if self._pull_image(rt):
                prepared = self._prepare(rt)
                if prepared is not None:
                    self._run_container(rt, *prepared)
                    return
            self._finish(rt, None)
        except Exception:  # a bug in the fake must not hang the test
            logger.exception("fake kubelet: pod %s/%s crashed the worker", rt.namespace, rt.name)
        finally:
            self._worker_done(rt)

    def _pull_image(self, rt: PodRuntime) -> bool:
        """ErrImagePull / ImagePullBackOff while the image is unpullable; False if stopped."""
        image = rt.container["image"]
        backoff = self.cluster.pull_backoff
        while self.cluster.is_unpullable(image):
            self._set_waiting(rt, "ErrImagePull", f'rpc error: code = NotFound desc = failed to '
                              f'pull and unpack image "{image}": not found')
            if rt.sleep(backoff):
                return False
            self._set_waiting(rt, "ImagePullBackOff", f'Back-off pulling image "{image}"')
            if rt.sleep(backoff):
                return False
            backoff = min(backoff * 2, 10.0)
        digest = hashlib.sha256(image.encode()).hexdigest()
        repository = re.sub(r"(:[^:/@]*)?(@.*)?$", "", image)
        rt.image_id = f"{repository}@sha256:{digest}"
        return True

    def _prepare(self, rt: PodRuntime) -> Optional[Tuple[List[str], Dict[str, str], Optional[str]]]:
        """argv, env and cwd of the container, retrying config errors; None if stopped."""
        while True:
            try:
                env = self.cluster.container_env(rt.namespace, rt.name, rt.container)
                command = list(rt.container.get("command") or [])
                if not command:
                    raise ConfigError("CreateContainerError", "fake kubelet (process mode) "
                                      "needs the container's command: it cannot run an "
                                      "image's entrypoint")
                argv = [expand_vars(a, env) for a in command + list(rt.container.get("args") or [])]
                return argv, env, rt.container.get("workingDir")
            except ConfigError as exc:
                self._set_waiting(rt, exc.reason, str(exc))
            if rt.sleep(self.cluster.pull_backoff):
                return None

    def _run_container(self, rt: PodRuntime, argv: List[str], env: Dict[str, str],
                       cwd: Optional[str]) -> None:
        """Run (and restart, per restartPolicy) the container until it is done for good."""
        backoff = self.cluster.restart_backoff
        while True:
            terminated = self._run_once(rt, argv, env, cwd)
            if not self._should_restart(rt, terminated["exitCode"]):
                self._finish(rt, terminated)
                return
            with self.lock:
                rt.restart_count += 1
                rt.last_state = {"terminated": terminated}
                rt.ready = rt.started = False
                rt.state = {"waiting": {"reason": "CrashLoopBackOff", "message": (
                    f"back-off {backoff:g}s restarting failed container={rt.container['name']} "
                    f"pod={rt.name}_{rt.namespace}({rt.uid})")}}
            self._publish(rt)
            if rt.sleep(backoff):
                self._finish(rt, None)
                return
            backoff = min(backoff * 2, 10.0)

    def _should_restart(self, rt: PodRuntime, exit_code: int) -> bool:
        if rt.stop_requested or rt.deadline_exceeded or self.stopping:
            return False
        policy = rt.spec.get("restartPolicy", "Always")
        return policy == "Always" or (policy == "OnFailure" and exit_code != 0)

    def _run_once(self, rt: PodRuntime, argv: List[str], env: Dict[str, str],
                  cwd: Optional[str]) -> dict:
        """Start the process, watch it until it ends; its ``terminated`` state."""
        rt.attempts += 1
        try:
            return self._run_process(rt, argv, env, cwd)
        finally:
            rt.finished_attempts = rt.attempts

    def _run_process(self, rt: PodRuntime, argv: List[str], env: Dict[str, str],
                     cwd: Optional[str]) -> dict:
        started_at = _now()
        try:
            self._spawn(rt, argv, env, cwd)
        except OSError as exc:
            return {"exitCode": 128, "reason": "StartError", "startedAt": _ts(0),
                    "finishedAt": _now(), "message": (
                        f"failed to create containerd task: exec: \"{argv[0]}\": "
                        f"{exc.strerror or exc}")}
        with self.lock:
            rt.state = {"running": {"startedAt": started_at}}
            rt.ready = rt.started = True
            rt.pod_ip = POD_IP
            rt.phase = "Running"
        self._publish(rt)
        returncode = self._monitor(rt)
        logger.debug("fake kubelet: pod %s/%s pid %d exited with %d", rt.namespace, rt.name,
                     rt.proc.pid, returncode)
        self._kill_tree(rt)  # the container's other processes die with it
        rt.group_released = True
        exit_code = returncode if returncode >= 0 else 128 - returncode
        reason = "Completed" if exit_code == 0 else "Error"
        if rt.oom:
            exit_code, reason = 137, "OOMKilled"
        return {"exitCode": exit_code, "reason": reason, "startedAt": started_at,
                "finishedAt": _now(), "containerID": rt.container_id}

    def _spawn(self, rt: PodRuntime, argv: List[str], env: Dict[str, str],
               cwd: Optional[str]) -> None:
        if cwd:
            os.makedirs(cwd, exist_ok=True)
        if self.cluster.pid_namespaces and not rt.spec.get("hostPID"):
            argv = ["unshare", "--pid", "--fork", "--kill-child", *argv]
        with open(rt.log_path(rt.attempts), "ab") as log:
            proc = subprocess.Popen(argv, env=env, cwd=cwd or None, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        with self.lock:
            rt.proc = proc
            rt.tree = {}
            rt.group_released = False
            rt.oom = False
            try:
                rt.ps = psutil.Process(proc.pid)
            except psutil.Error:
                rt.ps = None
            rt.container_id = f"fakeprocess://{proc.pid}"
            if rt.stop_requested or self.stopping:  # a request came in while it started
                if rt.evicted is not None or self.stopping or rt.kill_at <= time.monotonic():
                    self._kill_tree(rt)
                else:
                    self._terminate(rt)
        logger.debug("fake kubelet: pod %s/%s runs pid %d: %s", rt.namespace, rt.name,
                     proc.pid, argv)

    def _monitor(self, rt: PodRuntime) -> int:
        """Wait for the process, enforcing memory limit, deadline and deletion grace."""
        limit = ((rt.container.get("resources") or {}).get("limits") or {}).get("memory")
        limit_bytes = parse_quantity(limit) if limit is not None else None
        deadline = rt.spec.get("activeDeadlineSeconds")
        poll = self.cluster.poll_interval
        while True:
            wait = poll
            if rt.kill_at is not None:
                wait = max(0.01, min(poll, rt.kill_at - time.monotonic()))
            try:
                return rt.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
            rss = self._track_tree(rt)
            if limit_bytes is not None and rss > limit_bytes and not rt.oom:
                logger.info("fake kubelet: pod %s/%s over its memory limit (%d > %s): OOMKilled",
                            rt.namespace, rt.name, rss, limit)
                rt.oom = True
                self._kill_tree(rt)
            if deadline and time.monotonic() - rt.active_since > deadline:
                rt.deadline_exceeded = True
                self._kill_tree(rt)
            if rt.kill_at is not None and time.monotonic() >= rt.kill_at:
                self._kill_tree(rt)

    def _track_tree(self, rt: PodRuntime) -> int:
        """Remember the process's descendants; the RSS of the whole tree in bytes."""
        if rt.ps is None:
            return 0
        try:
            procs = [rt.ps] + rt.ps.children(recursive=True)
        except psutil.Error:
            return 0
        with self.lock:
            for proc in procs:
                rt.tree.setdefault(proc.pid, proc)
        rss = 0
        for proc in procs:
            try:
                rss += proc.memory_info().rss
            except psutil.Error:
                pass
        return rss

    def _terminate(self, rt: PodRuntime) -> None:
        """SIGTERM the container's main process only, as the runtime signals PID 1."""
        with self.lock:
            if rt.ps is not None:
                try:
                    rt.ps.send_signal(signal.SIGTERM)
                except psutil.Error:
                    pass

    def _kill_tree(self, rt: PodRuntime) -> None:
        """SIGKILL the process group and every descendant seen (all the container's processes)."""
        with self.lock:
            if rt.proc is None:
                return
            procs = list(rt.tree.values())
            if rt.ps is not None:
                procs.append(rt.ps)
                try:
                    procs.extend(rt.ps.children(recursive=True))
                except psutil.Error:
                    pass
            if not rt.group_released:  # once released, its id could be another group's
                try:
                    os.killpg(rt.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            for proc in procs:
                try:
                    proc.send_signal(signal.SIGKILL)
                except psutil.Error:
                    pass

    def _finish(self, rt: PodRuntime, terminated: Optional[dict]) -> None:
        """Report the pod's terminal phase (unless it is being deleted before it ran)."""
        with self.lock:
            if terminated is None and rt.deleting and rt.evicted is None:
                return
            rt.ready = False
            if terminated is not None:
                rt.state = {"terminated": terminated}
            exit_code = terminated["exitCode"] if terminated else 1
            rt.phase = "Succeeded" if exit_code == 0 else "Failed"
            if rt.evicted is not None:
                rt.phase, rt.reason, rt.message = "Failed", "Evicted", rt.evicted
            elif rt.deadline_exceeded:
                rt.phase, rt.reason = "Failed", "DeadlineExceeded"
                rt.message = "Pod was active on the node longer than the specified deadline"
        self._publish(rt)

    def _worker_done(self, rt: PodRuntime) -> None:
        with self.lock:
            rt.done = True
            if rt.deleting and self.runtimes.get(rt.uid) is rt:
                self.cluster.remove_object("Pod", rt.namespace, rt.name, uid=rt.uid)
            self.schedule()

    # -- status reporting ---------------------------------------------------------------
    def _set_waiting(self, rt: PodRuntime, reason: str, message: str) -> None:
        with self.lock:
            rt.state = {"waiting": {"reason": reason, "message": message}}
        self._publish(rt)

    def _publish(self, rt: PodRuntime) -> None:
        """Write the runtime's view into the pod's status (MODIFIED if anything changed)."""
        with self.lock:
            pod = self.cluster.store.get("Pod", rt.namespace, rt.name)
            if pod is None or pod["metadata"]["uid"] != rt.uid:
                return
            new = copy.deepcopy(pod)
            new["status"] = self._pod_status(rt, pod)
            self.cluster.store.replace(new)

    def _pod_status(self, rt: PodRuntime, pod: dict) -> dict:
        status = {"phase": rt.phase, "conditions": self._conditions(rt),
                  "hostIP": HOST_IP, "hostIPs": [{"ip": HOST_IP}], "startTime": rt.start_time,
                  "qosClass": pod["status"].get("qosClass"),
                  "containerStatuses": [self._container_status(rt)]}
        if rt.pod_ip:
            status["podIP"] = rt.pod_ip
            status["podIPs"] = [{"ip": rt.pod_ip}]
        if rt.reason:
            status["reason"] = rt.reason
        if rt.message:
            status["message"] = rt.message
        return status

    def _container_status(self, rt: PodRuntime) -> dict:
        status = {"name": rt.container["name"], "image": rt.container["image"],
                  "imageID": rt.image_id, "ready": rt.ready, "restartCount": rt.restart_count,
                  "started": rt.started, "state": rt.state, "lastState": rt.last_state}
        if rt.container_id:
            status["containerID"] = rt.container_id
        return status

    def _conditions(self, rt: PodRuntime) -> List[dict]:
        not_ready = ("PodCompleted", None) if rt.terminal and rt.evicted is None else (
            "ContainersNotReady", f"containers with unready status: [{rt.container['name']}]")
        wanted = [("PodReadyToStartContainers", rt.pod_ip is not None and not rt.terminal, None),
                  ("Initialized", True, None),
                  ("Ready", rt.ready, None if rt.ready else not_ready),
                  ("ContainersReady", rt.ready, None if rt.ready else not_ready),
                  ("PodScheduled", True, None)]
        if rt.evicted is not None:
            wanted.append(("DisruptionTarget", True, ("TerminationByKubelet", rt.evicted)))
        return [self._condition(rt, kind, ok, why) for kind, ok, why in wanted]

    @staticmethod
    def _condition(rt: PodRuntime, kind: str, ok: bool,
                   why: Optional[Tuple[str, Optional[str]]]) -> dict:
        status = "True" if ok else "False"
        previous = rt.transitions.get(kind)
        if previous is None or previous[0] != status:
            rt.transitions[kind] = previous = (status, _now())
        cond = {"type": kind, "status": status, "lastProbeTime": None,
                "lastTransitionTime": previous[1]}
        if why is not None:
            cond["reason"] = why[0]
            if why[1]:
                cond["message"] = why[1]
        return cond
