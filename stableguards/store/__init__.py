"""The ``store`` part: torch's own remote FX-graph and AOTAutograd caches served by the shared
store (``stableguards.storage``), so any process sharing it finds inductor's graphs and
AOTAutograd's entries (``hooks``)."""
