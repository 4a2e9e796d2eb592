"""Install distsim: ``pip install -e .`` (add ``[test]`` for the test suite)."""
from setuptools import find_packages, setup

setup(
    name="distsim",
    version="0.1.0",
    description="A discrete-event cluster simulator for distributed deep-learning training",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["distsim", "distsim.*"]),
    install_requires=[
        "simpy>=4.0",
        "networkx>=3.0",
        "numpy>=1.24",
        "onnx>=1.14",
        "matplotlib>=3.6",
        "pyyaml>=6.0",
        "pandas>=2.0",
    ],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6", "pyarrow>=12", "dask>=2023.1", "distributed>=2023.1",
                 "nbclient>=0.7", "nbformat>=5", "ipykernel>=6"],
        "dask": ["distributed>=2023.1", "dask>=2023.1"],
        "parquet": ["pyarrow>=12"],
        "export": ["torch", "transformers", "onnxscript"],
    },
    entry_points={"console_scripts": ["distsim=distsim.cli:entry"]},
)
