"""retool-rl: reinforcement learning for tool-integrated reasoning (ReTool).

A model writes reasoning, calls a Python ``code_interpreter``, a sandbox runs the
code, the output is appended to the context and the model continues; only the
final ``\\boxed{}`` answer is rewarded. See ``README.md`` for the package map.
"""

__version__ = "0.1.0"
