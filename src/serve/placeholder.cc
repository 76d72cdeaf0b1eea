namespace osprey {}
