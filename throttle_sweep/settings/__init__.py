"""From a composed config to checked objects, before any engine starts: `sections` checks one config group
at a time, `sweep` a whole sweep's configuration at once, `notes` says what runs but changes how to read the
answer. The commands only wire what these return."""
