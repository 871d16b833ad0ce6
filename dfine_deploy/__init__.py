"""dfine-deploy: train → export → benchmark → serve for the D-FINE detector.

The package is split by stage; nothing here imports torch, so the runtime side
(``runtime``, ``bench``, ``serve``) stays usable on machines without it.
"""

__version__ = "0.1.0"
