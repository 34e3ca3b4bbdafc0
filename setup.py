"""Packaging for fiberrl: the core needs only cloudpickle, psutil and numpy."""
from setuptools import find_packages, setup

EXTRAS = {
    "docker": ["docker>=7"],
    "kubernetes": ["kubernetes>=29"],
    # torch is pinned: this exact version resolves to the CPU wheel; a range would pull CUDA.
    "rl": ["torch==2.13.0", "gymnasium>=1.0", "tensorboard", "matplotlib", "tqdm",
           "pyarrow>=12", "scipy>=1.9"],
    "cpe": ["scipy>=1.9"],
    "bench": ["pandas", "stable-baselines3"],  # peers the benchmarks compare with
    "export": ["onnx>=1.23", "onnxscript>=0.7", "onnxruntime>=1.31"],
    "parquet": ["pyarrow>=12"],
    "test": ["pytest>=7", "pytest-timeout>=2", "pytest-xdist>=3.5", "scipy>=1.9", "pyarrow>=12", "gymnasium>=1.0",
             "docker>=7", "kubernetes>=29", "torch==2.13.0", "tensorboard", "matplotlib", "tqdm",
             "onnx>=1.23", "onnxscript>=0.7", "onnxruntime>=1.31",
             "joblib", "dask"],   # third-party programs run on fiberrl (test_third_party)
}
EXTRAS["all"] = sorted({req for reqs in EXTRAS.values() for req in reqs})

setup(
    name="fiberrl",
    version="0.1.0",
    description="multiprocessing's API with processes that run as cluster jobs, and RL on top",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["fiberrl", "fiberrl.*", "cpe", "cpe.*", "rl", "rl.*"]),
    install_requires=[
        "cloudpickle>=3",
        "psutil>=5.9",
        "numpy>=1.22",
        "tomli>=2; python_version < '3.11'",
    ],
    extras_require=EXTRAS,
    entry_points={
        "console_scripts": ["fiberrl = fiberrl.cli:main"],
        "fiberrl.commands": ["cpe = cpe.cli:register", "rl = rl.cli:register"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Operating System :: POSIX :: Linux",
        "Topic :: System :: Distributed Computing",
    ],
)
