"""Data-parallel offline training, one fiberrl process per rank (torch.distributed):
2 ranks end where 1 rank ends on the same global batches (local backend and the real
Slurm cluster), a rank that dies stops the run fast and names itself, and nothing is
left behind."""
import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")

from rl.data import generate_logged_data, run_timeline  # noqa: E402
from rl.data.identify import IdentifyOptions, identify_features  # noqa: E402
from rl.data.sampling import sample_features  # noqa: E402
from rl.data.spec import spec_features  # noqa: E402
from rl.distributed import RankFailedError, launch  # noqa: E402
from rl.envs import Gridworld  # noqa: E402
from rl.offline.dataset import OfflineDataset  # noqa: E402
from rl.offline.trainer import LocalBatches, OfflineSettings, OfflineTrainer  # noqa: E402

GAMMA = 0.9
SETTINGS = OfflineSettings(epochs=2, batch_size=128, target_update_every=10, cpe_mdps=0, seed=3,
                           checkpoint=False)


@pytest.fixture(scope="module")
def timeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed")
    generate_logged_data("rl/Gridworld-v0", 400, 0.5, root / "logs.parquet", seed=2)
    run_timeline(str(root / "logs.parquet"), root / "timeline", GAMMA, shards=4)
    samples, counts = sample_features(str(root / "timeline"), field="state_features")
    spec = identify_features(samples, {}, counts, IdentifyOptions(), field="state_features")
    return root / "timeline", spec


def _policy(spec):
    import gymnasium as gym
    from rl.algos.dqn import DQN
    from rl.data import FeatureNormalizer
    from rl.offline.preprocess import MaskedNormalizer
    features = spec_features(spec)
    torch.manual_seed(0)
    return DQN(gym.spaces.Box(0, 1, (len(features),)), gym.spaces.Discrete(4), seed=0,
               preprocessor=MaskedNormalizer(FeatureNormalizer(spec, features)),
               config={"gamma": GAMMA, "hidden": (32, 32), "lr": 1e-3})


def _dataset(directory, spec, shard):
    return OfflineDataset.from_timeline(directory, GAMMA, spec_features(spec),
                                        Gridworld.ACTION_NAMES, shard=shard)


def train_rank(ctx, directory, spec, die_at_epoch=None):
    torch.set_num_threads(1)
    dataset = _dataset(directory, spec, (ctx.rank, ctx.world_size))
    policy = _policy(spec)
    settings = OfflineSettings(**{**SETTINGS.__dict__, "epochs": 4 if die_at_epoch else 2})
    trainer = OfflineTrainer(policy, dataset, settings, rank=ctx.rank, world_size=ctx.world_size)
    if die_at_epoch is not None and ctx.rank == 1:
        original = trainer._epoch

        def epoch_then_die(epoch):
            if epoch == die_at_epoch:
                os.kill(os.getpid(), 9)
            original(epoch)
        trainer._epoch = epoch_then_die
    trainer.train()
    return torch.nn.utils.parameters_to_vector(policy.model.parameters()).detach().numpy()


class _GlobalBatches:
    """One rank's view of the two ranks' local batches, concatenated step by step."""

    def __init__(self, parts, offsets):
        self.parts, self.offsets = parts, offsets
        self.size = sum(p.size for p in parts)

    def epoch(self, epoch):
        for rows in zip(*(p.epoch(epoch) for p in self.parts)):
            yield np.concatenate([r + o for r, o in zip(rows, self.offsets)])


def _one_rank_on_global_batches(directory, spec):
    shards = [_dataset(directory, spec, (r, 2)) for r in range(2)]
    merged = OfflineDataset({k: np.concatenate([s.arrays[k] for s in shards])
                             for k in shards[0].arrays}, shards[0].features,
                            shards[0].action_names, GAMMA)
    local = SETTINGS.batch_size // 2
    steps = min(len(s) // local for s in shards)
    policy = _policy(spec)
    trainer = OfflineTrainer(policy, merged, SETTINGS)
    trainer.batches = _GlobalBatches([LocalBatches(s, local, SETTINGS.seed, r, steps)
                                      for r, s in enumerate(shards)], [0, len(shards[0])])
    trainer.train()
    return torch.nn.utils.parameters_to_vector(policy.model.parameters()).detach().numpy()


@pytest.mark.parametrize("fiberrl_backend", ["local", "slurm"], indirect=True)
def test_two_gloo_ranks_end_where_one_rank_ends_on_the_same_global_batches(timeline, fiberrl_backend):
    directory, spec = timeline
    ranks = launch(train_rank, 2, args=(directory, spec), resources={"mem": "1G"})
    assert np.array_equal(ranks[0], ranks[1])  # DDP keeps the replicas identical
    reference = _one_rank_on_global_batches(directory, spec)
    untrained = torch.nn.utils.parameters_to_vector(_policy(spec).model.parameters()).detach().numpy()
    assert not np.allclose(reference, untrained)
    np.testing.assert_allclose(ranks[0], reference, rtol=1e-4, atol=1e-5)


def test_a_rank_that_dies_stops_the_run_naming_it(timeline):
    directory, spec = timeline
    started = time.monotonic()
    with pytest.raises(RankFailedError, match=r"rank 1 on \S+ failed: .*SIGKILL") as failure:
        launch(train_rank, 2, args=(directory, spec, 1))
    assert failure.value.rank == 1
    assert time.monotonic() - started < 60


def test_workflow_with_two_ranks_trains_and_resumes(tmp_path):
    from rl.offline.workflow import load_config, run_workflow
    config_path = tmp_path / "grid.toml"
    config_path.write_text('''
out = "run"
[generate]
env = "rl/Gridworld-v0"
episodes = 200
[data]
gamma = 0.9
action_names = ["L", "R", "U", "D"]
[model]
hidden = [16]
[training]
epochs = 1
batch_size = 64
cpe_mdps = 20
n_bootstrap = 10
ranks = 2
rank_resources = {mem = "1G"}
[export]
formats = ["torchscript"]
''')
    first = run_workflow(load_config(config_path))
    assert first["world_size"] == 2 and [e["epoch"] for e in first["epochs"]] == [0]
    config = load_config(config_path)
    config.training.epochs, config.training.resume = 2, True
    second = run_workflow(config)
    assert [e["epoch"] for e in second["epochs"]] == [0, 1]
    assert second["epochs"][0] == first["epochs"][0]
    assert (tmp_path / "run" / "checkpoints" / "epoch-1.pt").exists()


def ppo_rank(ctx):
    import rl
    from rl.algos.ppo import PPO
    torch.set_num_threads(1)
    env = rl.make_vector_env("CartPole-v1", 2, seed=100 * ctx.rank)
    try:
        policy = PPO(env.observation_space, env.action_space, seed=ctx.rank,
                     config={"total_steps": 1024, "rollout_length": 32, "minibatch_size": 32})
        start = torch.nn.utils.parameters_to_vector(policy.model.parameters()).detach().clone()
        policy.enable_data_parallel(ctx.device)
        state = rl.run(policy, env, rl.AfterSteps(1024), seed=100 * ctx.rank, ranks=ctx.world_size)
    finally:
        env.close()
    end = torch.nn.utils.parameters_to_vector(policy.model.parameters()).detach()
    return start.numpy(), end.numpy(), state.env_steps, state.iterations


def test_ppo_learner_ranks_stay_identical_while_stepping_their_own_envs():
    (start0, end0, steps0, it0), (start1, end1, steps1, it1) = launch(ppo_rank, 2)
    assert not np.array_equal(start0, start1)      # seeded apart; DDP starts them from rank 0
    np.testing.assert_allclose(end0, end1, rtol=0, atol=1e-6)
    assert not np.allclose(end0, start0)
    assert steps0 == steps1 == 1024 and it0 == it1 == 1024 // (32 * 2 * 2)


def test_fiberrl_train_ppo_with_two_ranks_writes_global_counts_and_resumes(tmp_path):
    from rl.train import TrainSpec, train
    spec = TrainSpec(algo="ppo", env="CartPole-v1", out=tmp_path, total_steps=1024, num_envs=2,
                     eval_every=512, eval_episodes=2, progress=False, ranks=2,
                     overrides={"rollout_length": 32, "minibatch_size": 32})
    summary = train(spec)
    assert summary["env_steps"] == 1024 and summary["ranks"] == 2
    assert [point[0] for point in summary["curve"]] == [0, 512, 1024]
    spec.total_steps, spec.resume = 2048, True
    resumed = train(spec)
    assert resumed["env_steps"] == 2048 and resumed["curve"][:3] == summary["curve"]
    with pytest.raises(ValueError, match="--ranks > 1 is available for ppo"):
        train(TrainSpec(algo="dqn", env="CartPole-v1", out=tmp_path, ranks=2))


def td3_rank(ctx):
    import rl
    from rl.algos.td3 import TD3
    torch.set_num_threads(1)
    env = rl.make_vector_env("Pendulum-v1", 1, seed=100 * ctx.rank)
    try:
        policy = TD3(env.observation_space, env.action_space, seed=ctx.rank,
                     config={"learning_starts": 64, "batch_size": 32, "hidden": (32, 32)})
        policy.enable_data_parallel(ctx.device)
        rl.run(policy, env, rl.AfterSteps(200), seed=100 * ctx.rank, ranks=ctx.world_size)
    finally:
        env.close()
    return torch.nn.utils.parameters_to_vector(policy.model.parameters()).detach().numpy()


def test_td3_ranks_average_gradients_and_stay_identical():
    first, second = launch(td3_rank, 2)
    np.testing.assert_allclose(first, second, rtol=0, atol=1e-6)
