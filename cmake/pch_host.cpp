// pch_host.cpp - owner of a precompiled cmake/pch_std.h (CMakeLists.txt, af_use_pch); runs nothing.
int main() { return 0; }
