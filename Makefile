# Thin wrappers around tools/bootstrap.py (which also works where make does not, e.g. Windows).
PYTHON ?= python3

.PHONY: lab test test-all setup notebooks exercises bench

lab:        ## set up .venv if needed, then open the course in JupyterLab
	$(PYTHON) tools/bootstrap.py lab

test:       ## set up .venv if needed, then run the whole test suite
	$(PYTHON) tools/bootstrap.py test

test-all:   ## the same, and the sweeps it leaves out (every chapter through nbgrader): before a workshop
	$(PYTHON) tools/bootstrap.py test-all

setup:
	$(PYTHON) tools/bootstrap.py setup

notebooks:  ## authors: re-execute every lecture and solution notebook in place
	$(PYTHON) tools/bootstrap.py setup && .venv/bin/course execute notebooks solutions

exercises:  ## authors: regenerate exercises/ from solutions/
	$(PYTHON) tools/bootstrap.py setup && .venv/bin/course build-exercises
