"""Orchestration above the stages: flows that run several stages in turn.

A stage never reaches a later one; a flow may call every stage, the way the CLI
does. ``pinwheel attribute`` lives here: it replays variants (source), builds them
(compile), installs them (release) and serves them (serve).
"""
