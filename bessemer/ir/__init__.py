"""The IR: the layer graph models build (graph.py), the roles that name what a weight or a
node is for (roles.py), the pattern rewriter the fusion passes use (rewrite.py) and the NumPy
interpreter that runs a graph with the ops' references (interpret.py, the oracle of passes
and lowering). Below models, passes and targets; it imports only plugins/ops.py (the op set).
"""
