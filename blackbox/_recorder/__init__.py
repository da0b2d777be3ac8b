"""The rank side of blackbox: runs inside every rank of the job. Stdlib only, Python >= 3.9, and it never
imports the host side: the injected sitecustomize loads this package by path as `_blackbox_recorder`."""
