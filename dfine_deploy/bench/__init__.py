"""`dfine-bench`: latency, throughput, memory and accuracy beside the tables users quote.

Importing this package imports no torch (only `--train` and the torch backend do).
"""
