#include <cstdio>
int main() { std::puts("osprey: CLI not built yet"); return 1; }
