"""The generated pages: one per stage (stage), the overview (overview), the diagram gallery (gallery)."""
