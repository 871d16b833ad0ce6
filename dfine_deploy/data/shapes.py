"""The classes of the generated data (dfine_deploy/data/synthetic.py's scenes and moving.py's demo
video), in label order. A module of its own so that the torch-free runtime side (dfine-bench
--streams plays the demo video, on Python 3.8 too) can name them without the dataset code."""

CLASS_NAMES = ("rectangle", "ellipse", "triangle", "ring")
