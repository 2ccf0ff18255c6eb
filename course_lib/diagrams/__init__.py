"""Pictures the lectures draw with code (matplotlib), one module per topic.

Each function draws one diagram onto a matplotlib Axes (or makes its own figure) from the
numbers it is given, so a lecture's picture is computed, not pasted. Import from the submodule:
`from course_lib.diagrams.kernel import draw_tiled_loop`.
"""
