"""The Textual cockpit, built on the core's API. The core never imports it."""
