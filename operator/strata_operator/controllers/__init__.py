"""The Kopf handlers, one module per kind, thin: fetch, call the pure parts, run the engine, write back.
Importing a module registers its handlers (main.run imports them in order). May import every other room.

stack.py (the Stack controller: a daemon per Stack, its finalizer) with stack_session.py (one pass and its
status writes), stack_update.py (the run, approval, outputs Secret, drift) and stack_rollout.py;
program.py; workspace.py and update.py (PKO v2's Workspace and Update) with auto_state.py, what they
share; leadership.py (leader election); startup.py (settings, engine, metrics at start); context.py
(what every controller shares).
"""
