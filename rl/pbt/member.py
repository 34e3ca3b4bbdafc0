"""One member of a population: a learner in its own fiberrl process (a job on Slurm,
a container on Docker) that trains, reports and does what the controller answers.

Data flow between a member and the controller (:mod:`rl.pbt.controller`), one
``fiberrl.Pipe`` each::

    member process                                   controller (the master)
    Hello(host, pid)                        ───────>  notes where the member runs
    rl.run(agent, env, AfterSteps(total), [MemberHook])
      every ``report_every`` env steps, after a learning step:
        evaluate (deterministic, seeded episodes)
        Report(steps, evaluation, state_dict,  ───>  ranks the population, saves the
               counters, TensorBoard scalars)          checkpoint, maybe picks a donor
        Directive  <──────────────────────────────  nothing | adopt(donor's state) +
        adopt / set_hyperparameters                    new hyperparameters (explore)
      at the end: Report(final=True)           ───>  the member is finished
    an exception: Failure(traceback)           ───>  the member is dropped

The member keeps its agent, its envs (and an off-policy agent its replay buffer)
across reports; only an exploit replaces the learned state. Everything a member
knows travels in the messages, so no backend needs a shared file system.
"""
from __future__ import annotations

import logging
import os
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..loop import Episode, Hook, RunState

logger = logging.getLogger(__name__)


@dataclass
class MemberStart:
    """Everything a member process needs to start (or restart from a checkpoint)."""

    index: int
    builder: Callable[[Any], Any]  # TrainSpec -> Trainee (rl.registry.ALGORITHMS[algo])
    spec: Any                      # the member's TrainSpec: its seed, settings and budget
    hyperparameters: Dict[str, Any]
    report_every: int              # env steps between reports
    eval_episodes: int
    checkpoint: Optional[Dict[str, Any]] = None  # {"policy", "run"}: continue from here


@dataclass
class Hello:
    """The member's first message: where it runs."""

    host: str
    pid: int


@dataclass
class Report:
    """A member's progress: its evaluation and the learned state behind it."""

    env_steps: int
    eval_mean: float
    eval_std: float
    state: Dict[str, Any]          # the agent's state_dict at env_steps
    counters: Dict[str, Any]       # the run's counters (RunState.counters)
    scalars: List[Tuple[str, int, float]]  # (tag, env step, value) since the last report
    train_s: float                 # seconds spent training since the last report
    cpu_s: float                   # CPU seconds of this process since the last report
    wait_s: float                  # seconds spent waiting for the controller, in all
    final: bool = False


@dataclass
class Directive:
    """The controller's answer to a report: go on as you are, or adopt a donor's state
    (``adopt``; reseed with ``seed``) and use new ``hyperparameters``."""

    adopt: Optional[Dict[str, Any]] = None
    hyperparameters: Optional[Dict[str, Any]] = None
    seed: Optional[int] = None


@dataclass
class Failure:
    """An exception ended the member; its traceback."""

    traceback: str


class MemberHook(Hook):
    """The member's side of PBT inside :func:`rl.run` (see the module docstring).

    Reports fall after learning steps, so a report never splits a PPO batch: with
    batches of ``B`` env steps a report comes at the first multiple of ``B`` at or
    after each multiple of ``report_every``.
    """

    def __init__(self, conn: Any, start: MemberStart, eval_env: Any) -> None:
        self.conn, self.start, self.eval_env = conn, start, eval_env
        self.next_at = start.report_every
        self.scalars: List[Tuple[str, int, float]] = []
        self.clock, self.cpu = time.perf_counter(), time.process_time()
        self.wait_s = 0.0  # seconds spent waiting for the controller (its overhead)

    def experiment_pre(self, run: RunState) -> None:
        checkpoint = self.start.checkpoint
        if checkpoint is not None:
            run.policy.load_state_dict(checkpoint["policy"])
            run.restore(checkpoint["run"])
        run.policy.set_hyperparameters(self.start.hyperparameters)
        self.next_at = (run.env_steps // self.start.report_every + 1) * self.start.report_every
        self.clock, self.cpu = time.perf_counter(), time.process_time()

    def episode_post(self, run: RunState, episode: Episode) -> None:
        self.scalars.append(("train/episode_return", run.env_steps, float(episode.ret)))

    def learn_post(self, run: RunState, stats: Dict[str, float]) -> None:
        for key, value in stats.items():
            self.scalars.append((f"learn/{key}", run.env_steps, float(value)))
        if self.next_at <= run.env_steps < self.start.spec.total_steps:
            self.report(run, final=False)

    def experiment_post(self, run: RunState) -> None:
        self.report(run, final=True)

    def report(self, run: RunState, final: bool) -> None:
        """Evaluate, send a :class:`Report`, and carry out the controller's answer."""
        from ..evaluation import evaluate
        train_s = time.perf_counter() - self.clock
        result = evaluate(run.policy, self.eval_env, self.start.eval_episodes)
        cpu_s = time.process_time() - self.cpu
        run.evaluations.append((run.env_steps, result.mean, result.std))
        self.scalars.append(("eval/mean_return", run.env_steps, result.mean))
        sent = time.perf_counter()
        self.conn.send(Report(run.env_steps, result.mean, result.std, run.policy.state_dict(),
                              run.counters(), self.scalars, train_s, cpu_s, self.wait_s,
                              final))
        self.scalars = []
        directive: Directive = self.conn.recv()
        if directive.adopt is not None:
            run.policy.adopt(directive.adopt, directive.seed)
        if directive.hyperparameters:
            run.policy.set_hyperparameters(directive.hyperparameters)
        self.next_at = (run.env_steps // self.start.report_every + 1) * self.start.report_every
        self.wait_s += time.perf_counter() - sent
        self.clock, self.cpu = time.perf_counter(), time.process_time()


def member_main(conn: Any, start: MemberStart) -> None:
    """The body of a member's process: build the learner, train it under
    :class:`MemberHook` to the member's ``total_steps``, report an exception as a
    :class:`Failure`. A controller that goes away ends the member (its pipe closes)."""
    import torch
    torch.set_num_threads(1)  # small networks, several members per machine
    from ..loop import run
    from ..stops import AfterSteps
    from ..train import algorithm_names
    conn.send(Hello(socket.gethostname(), os.getpid()))
    try:
        algorithm_names()  # a fresh process: register the built-in algorithms
        trainee = start.builder(start.spec)
        try:
            hook = MemberHook(conn, start, trainee.eval_env or start.spec.env)
            run(trainee.agent, trainee.env, AfterSteps(start.spec.total_steps), [hook],
                seed=start.spec.seed)
        finally:
            for close in reversed(trainee.closers):
                close()
    except (EOFError, BrokenPipeError, ConnectionError):
        logger.info("member %d: the controller went away; stopping", start.index)
        raise SystemExit(0) from None
    except BaseException:
        try:
            conn.send(Failure(traceback.format_exc()))
        except (OSError, EOFError):
            pass
        raise SystemExit(1) from None

