"""Versions of outside packages that the project's tooling pins, each written once.

noxfile.py reads these with a regular expression (nox itself runs without anylogits or torch
installed), so each stays a plain ``NAME = "version"`` line.
"""

#: llama-cpp-python: the version the llama_cpp and bench nox sessions build and install, and
#: the source distribution whose vendored llama.cpp provides the tiny model's vocab files.
#: A new version may ship different vocab files: update ``_VOCAB_SHA256`` in
#: ``tiny_model/vocab_files.py`` with it (a mismatch fails the download loudly).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
