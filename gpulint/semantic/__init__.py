"""The semantic model rules query: how often code runs, where values live, what is a network, how data flows.

`vocab` names what training code means by its calls; `callgraph` follows calls across the program's files.
"""
