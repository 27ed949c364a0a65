"""Pure mask maths (torch only, no verl): the source the upstream series' S2T module is generated from."""
