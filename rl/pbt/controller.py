"""Population-based training (Jaderberg et al. 2017, "Population Based Training of
Neural Networks", arXiv:1711.09846): the controller that runs a population of
learners of any step-driven algorithm, each member a fiberrl ``Process`` (a Slurm
job, a Docker container, a local process), with the same code on every backend.

    spec = PopulationSpec(TrainSpec(algo="ppo", env="Pendulum-v1", total_steps=100_000,
                                    out="runs/pbt"), population=8)
    summary = train_population(spec)

Data flow (one controller thread; members in :mod:`rl.pbt.member`)::

    controller                                       member i (its own process)
    draw hyperparameters h_i (space.sample)
    start Process(member_main, MemberStart) ──────>  build agent + envs, train
    wait(pipes of every member, 0.5 s)  <── Report every report_every env steps
      record the evaluation, TensorBoard scalars
      bottom quantile? (records.truncation_selection)
        yes: donor's newest state, explore(h_donor)
      save the member's checkpoint, population.json
      Directive ──────────────────────────────────>  adopt / set_hyperparameters
    a member's process ended without its final report:
      restart it from its newest checkpoint (state and hyperparameters),
      or drop it after ``max_restarts`` deaths in a row
    all finished or dropped: summary.json, population.png, policy.pt of the best

There is no barrier: each member is answered as soon as it reports, from what the
controller knows then (the latest evaluation of every member), so a slow member
slows nobody else. ``interval=0`` runs the same members with the same reports and
checkpoints but never exploits: a random search, the baseline PBT must beat.

Units: ``total_steps``, ``interval`` and ``report_every`` are env steps of one member
(summed over its vector env); each member trains ``total_steps`` of its own.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np

import fiberrl

from ..registry import ALGORITHMS, TrainSpec
from . import outputs, space as spaces
from .member import Directive, Failure, Hello, MemberStart, Report, member_main
from .records import DROPPED, FINISHED, RUNNING, MemberRecord, PopulationState, truncation_selection

logger = logging.getLogger(__name__)

MEMBER_SEED_STRIDE = 1000  # member i trains with seed + i * MEMBER_SEED_STRIDE
POLL_S = 0.5               # how often the controller looks at processes between reports
EXIT_GRACE_S = 30.0        # how long a member that is done may take to exit before it is killed


class PopulationFailedError(RuntimeError):
    """Every member of a population was dropped; the message gives their reasons."""


@dataclass
class PopulationSpec:
    """A population: the training run each member makes, and PBT's settings."""

    train: TrainSpec                 # algo, env, seed, total_steps (per member), out, overrides
    population: int = 8              # members
    interval: Optional[int] = None   # env steps between exploit decisions; 0: random search;
                                     # None: total_steps / 10
    search: Optional[Dict[str, spaces.Param]] = None  # None: the algorithm's default space
    quantile: float = 0.25           # fraction of the population that copies / is copied
    resample_probability: float = 0.25  # explore: resample instead of perturbing a value
    max_restarts: int = 3            # restarts in a row (no report between); one more death drops
    member_resources: Dict[str, Any] = field(default_factory=lambda: {"mem": "1G"})  # per process
    builder: Optional[Callable[[TrainSpec], Any]] = None  # default: ALGORITHMS[train.algo]

    @property
    def report_every(self) -> int:
        """Env steps between a member's reports: the interval, or total/10 for a random search."""
        return self.interval or max(1, math.ceil(self.train.total_steps / 10))


def check_spec(spec: PopulationSpec) -> None:
    """ValueError for settings no population can run with."""
    if spec.population < 2:
        raise ValueError(f"a population needs at least 2 members, got {spec.population}")
    if spec.interval is not None and spec.interval < 0:
        raise ValueError(f"interval must be 0 (random search) or more env steps, got "
                         f"{spec.interval}")
    if not 0.0 < spec.quantile <= 0.5:
        raise ValueError(f"quantile must be in (0, 0.5], got {spec.quantile}")
    if not 0.0 <= spec.resample_probability <= 1.0:
        raise ValueError(f"resample_probability must be in [0, 1], got {spec.resample_probability}")
    if spec.max_restarts < 0:
        raise ValueError(f"max_restarts must be 0 or more, got {spec.max_restarts}")
    if spec.train.total_steps < 1:
        raise ValueError(f"total_steps must be at least 1, got {spec.train.total_steps}")


def train_population(spec: PopulationSpec) -> Dict[str, Any]:
    """Train the population to the end; returns the summary (also ``out/summary.json``).

    With ``spec.train.resume`` and a ``population.json`` in ``out``, the population
    continues from its members' newest checkpoints (after the controller died).
    Raises :class:`PopulationFailedError` when every member was dropped.
    """
    check_spec(spec)
    if spec.train.backend:
        fiberrl.init(backend=spec.train.backend)
    return _Controller(spec).run()


class _Controller:
    """The master's loop (see the module docstring)."""

    def __init__(self, spec: PopulationSpec) -> None:
        from ..train import algorithm_names
        algorithm_names()
        self.spec = spec
        self.out = Path(spec.train.out)
        self.builder = spec.builder or ALGORITHMS[spec.train.algo]
        self.state_path = self.out / "population.json"
        self.procs: Dict[int, Any] = {}
        self.conns: Dict[int, Any] = {}
        self.exiting: List[tuple] = []  # (process, deadline) of members that are done
        self.latest: Dict[int, Dict[str, Any]] = {}  # member -> its newest checkpoint
        self.started, self.cpu_started = time.perf_counter(), time.process_time()
        self.out.mkdir(parents=True, exist_ok=True)
        if spec.train.resume and self.state_path.exists():
            self.state = self._resumed()
        else:
            self.state = self._fresh()
        self.space = {key: spaces.parse_param(text) for key, text in self.state.search.items()}
        self.rng = np.random.default_rng()
        if self.state.rng:
            self.rng.bit_generator.state = self.state.rng
        self.writers = outputs.MemberWriters(self.out, self.state.members,
                                             resumed=spec.train.resume)
        self.progress = outputs.PopulationProgress(self.state, spec.train.progress)

    # -- setting up -------------------------------------------------------------------
    def _fresh(self) -> PopulationState:
        spec, train = self.spec, self.spec.train
        space = spec.search if spec.search is not None else spaces.default_space(
            train.algo, outputs.is_discrete_env(train.env))
        rng = np.random.default_rng(train.seed)
        members = []
        for index in range(spec.population):
            values = spaces.sample(space, rng)
            members.append(MemberRecord(index, train.seed + index * MEMBER_SEED_STRIDE, values,
                                        dict(values), schedule=[[0, dict(values)]]))
        return PopulationState(train.algo, str(train.env), train.seed, train.total_steps,
                               spec.interval if spec.interval is not None else spec.report_every,
                               spec.report_every, spec.quantile, spec.resample_probability,
                               spaces.describe(space), members, rng=rng.bit_generator.state)

    def _resumed(self) -> PopulationState:
        state = PopulationState.load(self.state_path)
        train = self.spec.train
        asked = (train.algo, str(train.env), train.total_steps, self.spec.population)
        found = (state.algo, state.env, state.total_steps, len(state.members))
        if asked != found:
            raise ValueError(f"--resume: {self.out} holds a population of {found[3]} {found[0]} "
                             f"members on {found[1]} for {found[2]} steps each, not {asked[3]} "
                             f"{asked[0]} on {asked[1]} for {asked[2]}")
        for member in state.members:
            if member.checkpoint:
                self.latest[member.index] = outputs.load_checkpoint(self.out / member.checkpoint)
            member.deaths_in_a_row = 0
        logger.info("resuming the population in %s", self.out)
        return state

    def _member_spec(self, member: MemberRecord) -> TrainSpec:
        train = self.spec.train
        return replace(train, seed=member.seed, out=self.out / outputs.member_dir(member.index),
                       overrides={**train.overrides, **member.hyperparameters}, resume=False,
                       progress=False)

    def _start(self, member: MemberRecord) -> None:
        start = MemberStart(member.index, self.builder, self._member_spec(member),
                            dict(member.hyperparameters), self.state.report_every,
                            self.spec.train.eval_episodes, self.latest.get(member.index))
        parent_end, child_end = fiberrl.Pipe()
        proc = fiberrl.Process(target=member_main, args=(child_end, start), daemon=True,
                               name=f"pbt-member-{member.index}", **self.spec.member_resources)
        proc.start()
        child_end.close()
        self.procs[member.index], self.conns[member.index] = proc, parent_end
        member.status = RUNNING

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        from fiberrl.connection import wait
        try:
            for member in self.state.members:
                if member.status == RUNNING:
                    self._start(member)
            self._save()
            while self.conns:
                ready = wait(list(self.conns.values()), timeout=POLL_S)
                for index in [i for i, c in self.conns.items() if c in ready]:
                    self._receive(index)
                for index in list(self.procs):
                    if index in self.procs and not self.procs[index].is_alive():
                        self._receive(index)  # what it sent before it ended comes first
                        if index in self.procs:
                            self._died(index)
                self._reap(wait=False)
                self.progress.update(running=len(self.procs))
        finally:
            self._stop_all()
            self.progress.close()
            self.writers.close()
        self._save()
        summary = outputs.finish(self.out, self.state, self.spec, self.builder, self.latest,
                                 self._wall_s(), time.process_time() - self.cpu_started)
        finished = [m for m in self.state.members if m.status == FINISHED]
        if not finished:
            reasons = "; ".join(f"member {m.index}: {m.reason}" for m in self.state.members)
            raise PopulationFailedError(f"every member was dropped ({reasons})")
        return summary

    def _receive(self, index: int) -> None:
        """Handle every message member ``index`` has sent; an ended pipe is a death."""
        conn = self.conns.get(index)
        while conn is not None and index in self.conns:
            try:
                if not conn.poll(0):
                    return
                message = conn.recv()
            except (EOFError, OSError):
                return  # the process's end is seen by is_alive and handled by _died
            member = self.state.members[index]
            if isinstance(message, Hello):
                member.host, member.pid = message.host, message.pid
                self._save()
            elif isinstance(message, Report):
                self._report(member, message)
            elif isinstance(message, Failure):
                last = message.traceback.strip().splitlines()[-1]
                self._drop(member, f"raised {last}")
                logger.error("member %d failed:\n%s", index, message.traceback)

    def _report(self, member: MemberRecord, report: Report) -> None:
        member.env_steps = report.env_steps
        member.evaluations.append([report.env_steps, report.eval_mean, report.eval_std,
                                   round(self._wall_s(), 3)])
        member.train_s += report.train_s
        member.cpu_s += report.cpu_s
        member.wait_s = report.wait_s
        member.deaths_in_a_row = 0
        self.writers.write(member.index, report.scalars, member.hyperparameters)
        directive = Directive()
        policy_state = report.state
        if not report.final and self.state.interval > 0:
            donor_index = truncation_selection(member.index, self.state.members,
                                               self.state.quantile, self.rng)
            if donor_index is not None:
                directive, policy_state = self._exploit(member, donor_index, report)
        self.latest[member.index] = {"policy": policy_state, "run": report.counters}
        member.checkpoint = outputs.save_checkpoint(self.out, member, self.latest[member.index])
        if report.final:
            member.status = FINISHED
        self._save()
        try:
            self.conns[member.index].send(directive)
        except (OSError, EOFError):   # _died restarts it from the checkpoint just saved
            logger.info("member %d ended after its report; it restarts from that checkpoint",
                        member.index)
        if report.final:
            self._forget(member.index)
        self.progress.update(running=len(self.procs))
        self.progress.reported(member, report.final)

    def _exploit(self, member: MemberRecord, donor_index: int, report: Report) -> tuple:
        """Member copies the donor's newest state and explores its hyperparameters."""
        donor = self.state.members[donor_index]
        values = spaces.explore(donor.hyperparameters, self.space, self.rng,
                                self.state.resample_probability)
        self.state.exploits += 1
        member.lineage.append({"env_steps": report.env_steps, "donor": donor.index,
                               "donor_env_steps": donor.env_steps, "score": member.score,
                               "donor_score": donor.score, "hyperparameters": values})
        member.hyperparameters = values
        member.schedule.append([report.env_steps, dict(values)])
        logger.info("member %d (%.1f) copies member %d (%.1f) at %d env steps: %s",
                    member.index, member.score, donor.index, donor.score, report.env_steps,
                    values)
        seed = member.seed + len(member.lineage)
        donor_state = self.latest[donor.index]["policy"]
        return Directive(adopt=donor_state, hyperparameters=values, seed=seed), donor_state

    def _died(self, index: int) -> None:
        """Member ``index``'s process ended before its final report."""
        proc = self.procs[index]
        proc.join(5)
        reason = proc.exit_reason or f"exit code {proc.exitcode}"
        self._forget(index)
        member = self.state.members[index]
        if member.status != RUNNING:
            return  # dropped for its exception, or finished
        member.restarts += 1
        member.deaths_in_a_row += 1
        if member.deaths_in_a_row > self.spec.max_restarts:
            self._drop(member, f"its process died {member.deaths_in_a_row} times in a row "
                               f"(last: {reason})")
            return
        logger.warning("member %d died (%s) on %s; restarting it from %s", index, reason,
                       member.host or "an unknown host", member.checkpoint or "the start")
        self._start(member)
        self._save()

    def _drop(self, member: MemberRecord, reason: str) -> None:
        member.status, member.reason = DROPPED, reason
        logger.warning("member %d dropped: %s", member.index, reason)
        self._forget(member.index)
        self._save()

    def _forget(self, index: int) -> None:
        """Stop listening to member ``index``; its process exits on its own (reaped by
        :meth:`_reap` without holding up the others, killed after EXIT_GRACE_S)."""
        proc, conn = self.procs.pop(index, None), self.conns.pop(index, None)
        if conn is not None:
            conn.close()
        if proc is not None:
            self.exiting.append((proc, time.monotonic() + EXIT_GRACE_S))

    def _reap(self, wait: bool) -> None:
        """Join the processes of members that are done; kill those past their grace
        (``wait``: wait for each up to its deadline first)."""
        left = []
        for proc, deadline in self.exiting:
            if wait:
                proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive() and time.monotonic() < deadline:
                left.append((proc, deadline))
                continue
            if proc.is_alive():
                proc.kill()
            proc.join(5)
        self.exiting = left

    def _stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.is_alive():
                proc.terminate()
        for index in list(self.procs):
            self._forget(index)
        self._reap(wait=True)

    def _wall_s(self) -> float:
        return self.state.wall_s + time.perf_counter() - self.started

    def _save(self) -> None:
        self.state.rng = self.rng.bit_generator.state if hasattr(self, "rng") else self.state.rng
        wall = self.state.wall_s
        self.state.wall_s = self._wall_s()
        self.state.save(self.state_path)
        self.state.wall_s = wall
