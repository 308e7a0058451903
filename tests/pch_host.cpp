// pch_host.cpp - owner of the tests' one precompiled gtest/gtest.h (tests/CMakeLists.txt); runs nothing.
int main() { return 0; }
