"""The embedded default model's offline pipeline: data, training loop, install.

Never imported by `python -m bot run`.
"""
