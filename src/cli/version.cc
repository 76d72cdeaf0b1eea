namespace osprey {
const char* kOspreyVersion = "0.1.0";
}  // namespace osprey
